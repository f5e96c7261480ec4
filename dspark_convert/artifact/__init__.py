"""The artifact: its format tables (``format``), ``manifest.json`` and its reader
(``manifest``), how both files are written (``writer``), the engines' rules by stage
(``engines``, ``engine_names``) and the quantized artifact's type rule (``quantized``).
"""
