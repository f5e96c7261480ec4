"""Byte formats: readers of safetensors and GGUF, numerics, quantization blocks.

The flat modules (``gguf_reader``, ``safetensors_reader``, ``numerics``) move here with
issue 12; new format code is written here from the start (``quants``).
"""
