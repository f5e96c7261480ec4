"""Byte formats: readers of safetensors and GGUF, numerics, quantization blocks.

The readers (``gguf_reader``, ``safetensors``, ``numerics``) and the quantization blocks
(``quants``) live here, one module per format.
"""
