"""Package discovery: every package under schedlang/, plus grammar/ and models/ shipped inside
it as data-only packages (pyproject.toml maps their folders and lists their files). The
metadata is in pyproject.toml; setuptools' `packages.find` alone cannot add packages that live
outside the package's folder."""
from setuptools import find_packages, setup

setup(packages=[*find_packages(include=["schedlang", "schedlang.*"]),
                "schedlang.grammar", "schedlang.models"])
