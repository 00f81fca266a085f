# Standard nbdev 2 setup.py: everything is read from settings.ini.
from configparser import ConfigParser
import setuptools

cfg = ConfigParser(delimiters=['='])
cfg.read('settings.ini')
cfg = cfg['DEFAULT']
expected = 'version description keywords author author_email'.split()
missing = [o for o in expected if o not in cfg]
assert not missing, f"settings.ini is missing {missing}"
setuptools.setup(
    name=cfg['lib_name'],
    version=cfg['version'],
    description=cfg['description'],
    keywords=cfg['keywords'].split(),
    author=cfg['author'],
    author_email=cfg['author_email'],
    license='Apache-2.0',
    url=cfg['git_url'],
    packages=setuptools.find_packages(include=['attnrepro', 'attnrepro.*']),
    include_package_data=True,
    package_data={'attnrepro': ['sample_data/*']},
    install_requires=(cfg.get('requirements', '') + ' ' + cfg.get('pip_requirements', '')).split(),
    extras_require={'dev': cfg.get('dev_requirements', '').split()},
    python_requires='>=' + cfg['min_python'],
    zip_safe=False,
    entry_points={
        'console_scripts': cfg.get('console_scripts', '').split(),
        'nbdev': [f'{cfg["lib_path"]}={cfg["lib_path"]}._modidx:d'],
    },
)
