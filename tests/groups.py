"""pytest-xdist groups: tests that must run on one worker, in order (`--dist loadgroup`, scripts/test.sh).

KIT_GROUP: the end-to-end stories on the kit's one node, and the tests that need the host state those
stories change (tests/conftest.py marks the stories; the others mark themselves).
"""

KIT_GROUP = "kit-node"
