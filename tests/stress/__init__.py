"""In-guest reliability suite (issue 7): see conftest.py and docs/reliability.md.

A package, so that its conftest is imported as ``stress.conftest`` and does
not shadow ``tests/conftest.py`` (imported as ``conftest``) on the host.
"""
