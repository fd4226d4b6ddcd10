"""requirements.txt is the one source of exact versions; environment.yml must mirror it."""
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def pins_from_requirements():
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    return {l.split("==")[0].lower(): l.split("==")[1].strip() for l in lines
            if l.strip() and not l.startswith("#")}


def test_every_requirement_is_pinned_exactly():
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            assert re.fullmatch(r"[A-Za-z0-9_.\-]+==[0-9][0-9A-Za-z.\-]*", line.strip()), line


def test_environment_yml_mirrors_requirements():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert "python=3.11" in env["dependencies"]
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    env_pins = {p.split("==")[0].lower(): p.split("==")[1] for p in pip_section if "==" in p}
    assert env_pins == pins_from_requirements()


def test_the_stack_the_platform_notes_require():
    pins = pins_from_requirements()
    assert pins["mindspore"] == "2.9.0" and pins["mindformers"] == "1.9.0"
    assert pins["numpy"].startswith("1.") and pins["protobuf"] == "3.20.1"


def test_installed_versions_match_the_pins():
    from importlib.metadata import version
    for name, v in pins_from_requirements().items():
        assert version(name) == v, f"{name}: installed {version(name)}, pinned {v}"
