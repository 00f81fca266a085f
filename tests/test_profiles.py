"""Every paper's profiles name datasets and teachers that exist (or are being made by the teachers notebook),
so that a typo fails here in a second rather than an hour into a mini run."""
import json

import pytest
import yaml

from attnrepro.core import project_root
from attnrepro.data import list_datasets
from attnrepro.models import BUILTIN_TEACHERS, teacher_names
from attnrepro.recipes import RECIPE_SCHEMAS, RecipeError, read_profiles, resolve_profile, validate_recipe
from attnrepro.report import load_profile
from attnrepro.runner import runnable_papers

ROOT = project_root()
PAPERS = [p for p in runnable_papers() if p != "teachers"]
TEACHER_KEYS = {"teacher", "imagenet_teacher", "teachers", "sources", "source", "pretrained"}
EMBEDDED = {"cifar10-sample", "tiny-imagenet-sample", "digits"}


def profiles(paper):
    "Every profile of `paper` as the notebooks get it: `extends` resolved."
    raw = read_profiles(ROOT / "papers" / paper / "profiles.yaml")
    return {name: resolve_profile(raw, name) for name in raw}


def walk(obj, path=()):
    "(path, key, value) of every leaf."
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from walk(v, path + (str(k),))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from walk(v, path + (f"[{i}]",))
    else:
        yield path, obj


def dataset_names(obj, in_data=False):
    "Dataset names in data / datasets blocks: a block's `name`, else its `train` / `val` strings."
    out = set()
    if isinstance(obj, dict):
        if in_data and isinstance(obj.get("name"), str):
            out.add(obj["name"])
        elif in_data:
            out |= {obj[k] for k in ("train", "val") if isinstance(obj.get(k), str)}
        for k, v in obj.items():
            out |= dataset_names(v, in_data or str(k).startswith("data"))
    elif isinstance(obj, list):
        for v in obj:
            out |= dataset_names(v, in_data)
    return out


def teacher_refs(profile):
    "String teachers a profile names (dict specs are tiny_teacher kwargs, checked by the smoke run itself)."
    return {v for p, v in walk(profile) if isinstance(v, str) and any(k in TEACHER_KEYS for k in p)
            and not p[-1].startswith("paper_") and p[-1] not in ("algorithm", "data", "teacher_eval")}


def planned_teachers():
    "The teachers the teachers notebook makes at mini (committed) and gpu (trained in GPU windows)."
    return {name for prof in ("mini", "gpu") for name in profiles("teachers")[prof]["teachers"]}


@pytest.mark.parametrize("paper", PAPERS)
def test_has_its_profiles(paper):
    "smoke, mini and paper; gpu too for every paper of the gpu queue (papers/gpu_queue.yaml, issue 44)."
    from attnrepro.budget import queue_order
    want = {"smoke", "mini", "paper"} | ({"gpu"} if paper in queue_order() else set())
    assert want <= set(profiles(paper)), f"papers/{paper}/profiles.yaml lacks {want - set(profiles(paper))}"


@pytest.mark.parametrize("paper", PAPERS)
@pytest.mark.parametrize("profile", ["smoke", "mini", "gpu"])
def test_named_datasets_are_registered(paper, profile):
    if profile not in profiles(paper): pytest.skip(f"{paper} has no {profile} profile (not in the gpu queue)")
    names = dataset_names(profiles(paper)[profile])
    assert names, f"{paper} {profile}: found no dataset names (test walker out of date?)"
    assert names <= set(list_datasets()), f"{paper} {profile}: unknown datasets {names - set(list_datasets())}"


@pytest.mark.parametrize("paper", PAPERS)
def test_smoke_uses_only_embedded_data(paper):
    names = dataset_names(profiles(paper)["smoke"])
    assert names <= EMBEDDED, f"{paper} smoke uses {names - EMBEDDED}; smoke must run on a fresh clone"


@pytest.mark.parametrize("paper", PAPERS)
@pytest.mark.parametrize("profile", ["smoke", "mini", "gpu"])
def test_named_teachers_exist_or_are_planned(paper, profile):
    if profile not in profiles(paper): pytest.skip(f"{paper} has no {profile} profile (not in the gpu queue)")
    known = set(BUILTIN_TEACHERS) | set(teacher_names()) | planned_teachers()
    refs = teacher_refs(profiles(paper)[profile])
    assert refs <= known, f"{paper} {profile}: unknown teachers {refs - known}; known: {sorted(known)}"


def test_walkers_find_what_they_should():
    p = {"data": {"tiny": {"name": "tiny-imagenet", "train": "train"}, "train": "cifar10", "val_split": "val"}, "teachers": {"mae": "mae_x"}, "cifar": {"teacher": "r56"},
         "rows": [{"paper_teacher": "ResNet34", "teacher": "r20"}], "name": "not-a-dataset"}
    assert dataset_names(p) == {"tiny-imagenet", "cifar10"}
    assert teacher_refs(p) == {"mae_x", "r56", "r20"}


def test_attention_transfer_pilot_is_the_teachers_gate_regime():
    """attention_transfer's pilot re-runs the teachers notebook's CIFAR-10 gate regime (whose seed spread and timings
    sized it) with the paper's four arms; smoke only has to exercise the same keys."""
    at = profiles("attention_transfer")
    for prof in ("smoke", "mini", "gpu"):
        P = at[prof]
        pl = P["pilot"]
        assert pl["data"] in P["data"] and pl["schedule"] in P["recipes"] and pl["teacher_key"] in P["teachers"], prof
        assert set(pl["arm_seeds"]) == {"scratch", "finetune", "copy", "distill"}, prof
        assert P["recipes"][pl["schedule"]]["val"] == "val" and not P["data"][pl["data"]].get("val_per_class"), prof
    for prof, headline in (("mini", "mae_cifar10_mini"), ("gpu", "mae_cifar10_gpu")):   # gpu: issue 44's regime
        teachers = profiles("teachers")[prof]
        gate = teachers["gates"]
        task = gate["tasks"]["cifar10"]
        P = at[prof]
        pl = P["pilot"]
        data, recipe = P["data"][pl["data"]], P["recipes"][pl["schedule"]]
        assert {k: data.get(k) for k in task["data"]} == task["data"], prof   # cifar10, its subset, full test split
        assert data.get("per_class") == task["data"].get("per_class"), prof  # mini 500 per class, gpu all 50k
        assert recipe["train"] == task["train"] and recipe["augment"] == task["augment"], prof
        assert recipe.get("drop_path_rate", 0.0) == 0.0                      # the gate runs' students (scratch_student's default)
        assert P["shape"] == teachers["arch"], prof
        assert P["teachers"][pl["teacher_key"]] == headline
        assert all(len(s) >= 2 for s in pl["arm_seeds"].values()) and pl["floor"] == gate["scratch_floor"], prof


def test_attndistill_headline_reuses_the_pilot_runs():
    """attndistill's Figure 6 trains the pilot's recipe (`headline: {schedule: pilot}`), so a seed the pilot ran is the
    same config hash and its committed run is reused (the notebook asserts the hashes at smoke). This pins the mini
    pilot recipe to the one the committed 8-epoch pilot runs were trained with, and the Table 10 schedule to a
    shorter one with a several-seed reference pair (the seed sd its one-seed rows borrow)."""
    ad = profiles("attndistill")
    for prof in ("smoke", "mini"):
        head, short, pilot = ad[prof]["headline"], ad[prof]["short"], ad[prof]["pilot"]
        assert head.get("schedule") == "pilot" and "train" not in head, f"{prof}: headline must read the pilot's recipe"
        assert len(short["ref_seeds"]) >= 2 and short["train"]["epochs"] < pilot["train"]["epochs"], prof
    mini = ad["mini"]
    runs = [json.loads(f.read_text()) for f in (ROOT / "outputs" / "attndistill" / "runs").glob("*.json")]
    committed = {(r["name"].split("/")[0], r["config"]["seed"]) for r in runs
                 if "/pilot/" in (r.get("name") or "") and r["config"]["train"] == mini["pilot"]["train"]}
    want = {(f"base_{m}", s) for m in ("pa", "ad") for s in (0, 1)}
    assert want <= committed, (f"the mini pilot recipe no longer matches the committed pilot runs {sorted(want - committed)}: "
                               "Figure 6 would retrain them (restore the recipe, or retrain on purpose and update this test)")
    assert {s for _, s in committed} <= set(mini["headline"]["seeds"])


def test_attention_transfer_main_table_is_the_pilot_regime():
    """Table 1 runs the pilot's regime (task, teacher, schedule), so the pilot's runs are its seeds (the notebook checks
    the config hashes); the sweeps name a recipe that exists and the seeds of the rows claims 3, 4, 6 rest on."""
    at = profiles("attention_transfer")
    for prof in ("smoke", "mini"):
        P, pl = at[prof], at[prof]["pilot"]
        assert P["main"] == {"data": pl["data"], "teacher_key": pl["teacher_key"], "schedule": pl["schedule"]}, prof
        assert {s for ss in pl["arm_seeds"].values() for s in ss} <= set(P["seeds"]), prof
        sw = P["sweeps"]
        assert sw["schedule"] in P["recipes"] and sw["claim_seeds"], prof
        assert P["recipes"][sw["schedule"]]["val"] == "val" and not P["data"][P["main"]["data"]].get("val_per_class"), prof
        assert not P.get("method_recipes"), f"{prof}: one recipe for every method (methods differ only in what they transfer)"
        assert {"mae", "dino", "supervised"} <= set(P["teachers"]), prof   # the pre-training-method rows
    assert len(at["mini"]["seeds"]) >= 3 and len(at["mini"]["sweeps"]["claim_seeds"]) >= 2


def test_attention_transfer_paper_profile_encodes_each_methods_recipe():
    "The paper profile: every method its recipe (Tables 15/16, beta2 0.95 for partial copies, MAE's scratch/fine-tune)."
    P = profiles("attention_transfer")["paper"]
    mr = P["method_recipes"]
    assert {"scratch", "finetune", "copy", "partial_copy", "distill"} <= set(mr) and set(mr.values()) <= set(P["recipes"])
    copy_, part, dist = (P["recipes"][mr[k]] for k in ("copy", "partial_copy", "distill"))
    assert copy_["train"]["lr"] == 1e-3 and copy_["train"]["min_lr"] == 2e-3 and copy_["layer_decay"] == 0.75
    assert part["train"]["betas"] == [0.9, 0.95] and {k: v for k, v in part["train"].items() if k != "betas"} == \
        {k: v for k, v in copy_["train"].items() if k != "betas"}
    assert dist["train"]["lr"] == 1e-4 and dist["train"]["weight_decay"] == 0.3 and dist["drop_path_rate"] == 0.2
    assert P["recipes"][mr["finetune"]]["layer_decay"] == 0.75
    # MoCo-v3 / FLIP ViT-L: no weights this package loads (the profile's header says what is not reproduced)
    assert {"mae", "dino", "mae_b", "mae_h"} <= set(P["teachers"]) and not {"mocov3", "flip"} & set(P["teachers"])
    assert {v["teacher"] for v in P["model_sizes"].values()} <= set(P["teachers"])
    assert set(P["sweeps"]["teachers"].values()) <= set(P["teachers"])   # Table 7's rows
    assert P["distill"]["weight"] == 3.0 and P["distill"]["other_weight"] == 1.0   # lambda 1 for every non-headline row
    assert all(r["global_pool"] == "avg" for r in P["recipes"].values())   # the official code's global_pool=True


def test_aal_mini_reuses_the_pilots_committed_ce_runs():
    """aal's mini sweep lists the pilot's CE runs it reuses by hash (the notebook asserts its own configs hash to them):
    each is committed, and its recorded config is the one the profile describes (the sweep's regime, the CIFAR student,
    the profile's optimiser, evaluated once), so the re-run trains none of them again."""
    from attnrepro.core import config_hash
    P = profiles("aal")["mini"]
    sw = P["sweep"]
    assert sw["reuse"], "aal mini lists no reused runs"
    for r in sw["reuse"]:
        R = P["regimes"][sw["fractions"][r["fraction"]]]
        assert r["arm"] == "ce" and not (r["fraction"] == sw["curve"]["fraction"] and "ce" in sw["curve"]["arms"])
        assert r["seeds"] == sw["arm_seeds"]["ce"][r["fraction"]] and len(r["hashes"]) == len(r["seeds"])
        train = {k: v for k, v in P["train"].items() if k != "warmup_frac"}
        for seed, h in zip(r["seeds"], r["hashes"]):
            want = dict(table=R["tag"], data=R["data"], augment=R["augment"], arch=P[sw["student"]], method={"kind": "ce"},
                        probes=None, train=dict(train, epochs=R["epochs"], eval_every=R["epochs"], seed=seed,
                                                warmup_epochs=round(P["train"]["warmup_frac"] * R["epochs"], 3)))
            rec = json.loads((ROOT / "outputs" / "aal" / "runs" / f"{h}.json").read_text())
            assert rec["hash"] == h == config_hash(rec["config"]) == config_hash(want), (seed, h)


def test_aal_paper_profile_encodes_table3_batch_and_table_e_epochs():
    "Table 3 at batch 1024 at every fraction ('we maintain batch size 1024'), Table 2 at 512 for 5 / 10 %, Table E 240 epochs."
    P = profiles("aal")["paper"]
    reg, sw = P["regimes"], P["sweep"]
    batch = lambda name: reg[name].get("batch_size", P["train"]["batch_size"])
    assert {f: batch(r) for f, r in sw["fractions"].items()} == {5: 512, 10: 512, 30: 1024, 50: 1024, 100: 1024}
    t3 = {f: P["table3"]["fractions"].get(f, r) for f, r in sw["fractions"].items()}
    assert {batch(r) for r in t3.values()} == {1024}
    assert all(reg[t3[f]]["data"] == reg[sw["fractions"][f]]["data"] for f in t3)   # same subsets as Table 2
    assert reg[P["table_e"]["regime"]]["epochs"] == 240 and reg[P["table_e"]["regime"]]["data"]["fraction"] == 0.05
    assert batch(P["ablation"]["lambda_regime"]) == 1024   # its lambda-2000 row is Table 3's selective 10 %


@pytest.mark.parametrize("paper", ["aal", "bootstrapping_vit"])
def test_paper_profile_teachers_are_hub_names_or_null(paper):
    """The paper profile trains (on GPUs): every teacher it names loads from the timm hub; a teacher the paper does not
    name or publish is null, and the notebook's row says so (never a description no loader can read)."""
    keys = TEACHER_KEYS | {"label_teacher", "transfer_init"}
    leaves = [(p, v) for p, v in walk(profiles(paper)["paper"]) if any(k in keys for k in p) and p[-1] != "teacher_eval"
              and not p[-1].startswith("paper_")]
    bad = [(p, v) for p, v in leaves if v is not None and not (isinstance(v, str) and v.startswith("timm:"))]
    assert leaves and not bad, bad


@pytest.mark.parametrize("paper", runnable_papers())
def test_every_profile_matches_its_recipe_schema(paper):
    assert paper in RECIPE_SCHEMAS, f"declare a @recipe_schema for {paper} in attnrepro.recipes"
    for name, P in profiles(paper).items():
        assert validate_recipe(paper, P) == P
        assert load_profile(paper, name) == P


def _gta_mini():
    return profiles("gta")["mini"]


@pytest.mark.parametrize("change,message", [
    (lambda P: P.update(heldot=0.2), "[mini]: unknown key 'heldot' (did you mean 'heldout'?)"),
    (lambda P: P.pop("rates"), "missing required keys ['rates']"),
    (lambda P: P.update(keep_mass="0.6"), "keep_mass must be float, got str"),
    (lambda P: P.update(figure_images=True), "figure_images must be int, got bool"),
    (lambda P: P["pilot"]["train"].update(lrr=1e-3), "pilot.train.lrr is not a TrainConfig field (did you mean 'lr'?)"),
])
def test_a_bad_recipe_key_is_named_on_load(tmp_path, change, message):
    "load_profile refuses a misspelt, missing or mistyped key with the file, profile and key path in the message."
    P = _gta_mini()
    change(P)
    (tmp_path / "papers" / "gta").mkdir(parents=True)
    (tmp_path / "papers" / "gta" / "profiles.yaml").write_text(yaml.safe_dump({"mini": P}))
    with pytest.raises(RecipeError) as e:
        load_profile("gta", "mini", root=tmp_path)
    assert message in str(e.value) and "profiles.yaml" in str(e.value)


def test_extends_merges_and_replace_replaces(tmp_path):
    "A profile extending another is that profile deep-merged with its own keys; `!replace` swaps a dict whole."
    base = _gta_mini()
    text = yaml.safe_dump({"mini": base}) + """
smoke:
  extends: mini
  note: a cheaper mini
  train: {batch_size: 8}
  datasets: !replace {out: {name: cifar10-sample}}
  seeds: [0]
paper: {extends: paper}
"""
    (tmp_path / "papers" / "gta").mkdir(parents=True)
    (tmp_path / "papers" / "gta" / "profiles.yaml").write_text(text)
    got = load_profile("gta", "smoke", root=tmp_path)
    assert got["train"] == {**base["train"], "batch_size": 8} and got["seeds"] == [0]
    assert got["datasets"] == {"out": {"name": "cifar10-sample"}} and got["note"] == "a cheaper mini"
    assert {k: v for k, v in got.items() if k not in ("train", "datasets", "seeds", "note")} == \
           {k: v for k, v in base.items() if k not in ("train", "datasets", "seeds", "note")}
    with pytest.raises(RecipeError, match="cycle: paper -> paper"):
        load_profile("gta", "paper", root=tmp_path)


@pytest.mark.parametrize("paper", ["aal", "attndistill", "bootstrapping_vit", "gta", "attention_transfer"])
def test_paper_profile_trains_under_bf16_autocast(paper):
    "Every training recipe of the paper profile (every `train*` mapping, at any depth) turns bf16 autocast on for GPUs."
    def recipes(x, key=""):
        if isinstance(x, dict):
            if key.startswith("train") and "lr" in x: yield key, x
            for k, v in x.items(): yield from recipes(v, str(k))
        elif isinstance(x, list):
            for v in x: yield from recipes(v, key)
    found = list(recipes(load_profile(paper, "paper")))
    assert found and all(r.get("amp") is True for _, r in found), [(k, r.get("amp")) for k, r in found]


def test_a_stray_recipe_key_fails_the_notebooks_finish(tmp_path):
    "A key the schema allows but nothing reads (a nested one too) fails `PaperRun.finish(P)`, named with its path."
    from attnrepro.report import PaperRun
    P = _gta_mini()
    P["train"]["label_smoothing"] = 0.1                 # a TrainConfig field passes the schema, but nothing reads it here
    (tmp_path / "papers" / "gta").mkdir(parents=True)
    (tmp_path / "papers" / "gta" / "profiles.yaml").write_text(yaml.safe_dump({"mini": P}))
    got = load_profile("gta", "mini", root=tmp_path)
    def read_all(node, skip):   # the notebook's reads: every key, at every depth, except `skip`
        for k in list(dict.keys(node)):
            if k == skip: continue
            v = node[k]
            for x in (v if isinstance(v, list) else [v]):
                if isinstance(x, dict): read_all(x, skip)
    read_all(got, "label_smoothing")
    pr = PaperRun("gta", "mini", tmp_path / "out")
    with pytest.raises(RecipeError) as e:
        pr.finish(got)
    assert "train.label_smoothing" in str(e.value) and "[mini]" in str(e.value) and "train.lr" not in str(e.value)
    assert not (tmp_path / "out" / "runs_used.json").exists()   # nothing written: the runner keeps earlier outputs
    dict(got["train"])                                  # the section passed on whole: now every key took effect
    pr.finish(got)
    assert (tmp_path / "out" / "runs_used.json").exists()


def test_code_that_overrides_a_loaded_recipe_key_fails(tmp_path):
    "A value the profile set, replaced by code after loading (`[]=` or `update`), raises naming the key path."
    P = _gta_mini()
    (tmp_path / "papers" / "gta").mkdir(parents=True)
    (tmp_path / "papers" / "gta" / "profiles.yaml").write_text(yaml.safe_dump({"mini": P}))
    got = load_profile("gta", "mini", root=tmp_path)
    lr = got["train"]["lr"]
    with pytest.raises(RecipeError, match=r"overrides recipe key train\.lr"):
        got["train"]["lr"] = lr * 10
    with pytest.raises(RecipeError, match=r"train\.lr"):
        got["train"].update(lr=lr / 2)
    assert got["train"]["lr"] == lr
    got["train"]["lr"] = lr                # the same value: nothing overridden
    got["train"]["derived_note"] = "x"     # a key the profile did not set: code may add it
    assert got["train"]["derived_note"] == "x"


@pytest.mark.parametrize("paper", PAPERS)
def test_every_paper_notebook_checks_its_recipe_at_the_end(paper):
    "Each paper notebook hands its recipe to `pr.finish`, which fails on a key nothing read."
    cells = json.loads((ROOT / "nbs" / "papers" / f"{paper}.ipynb").read_text())["cells"]
    assert any("pr.finish(P)" in "".join(c["source"]) for c in cells), f"nbs/papers/{paper}.ipynb: call pr.finish(P)"
