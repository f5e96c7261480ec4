"""Helpers shared by the test modules (imported as ``support``; test modules never import
each other)."""
