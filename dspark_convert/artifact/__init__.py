"""The artifact: format tables, manifest, the engines' rules, quantization.

The flat ``artifact_format`` and ``manifest`` modules move here with issue 12; new
artifact code is written here from the start (``engines``, ``quantize``).
"""
