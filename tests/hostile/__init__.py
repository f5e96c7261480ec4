"""The hostile-input corpus (make_corpus.py), a package so that tests import it as
``from hostile import make_corpus`` (tests/ is on the path pytest gives its test modules)."""
