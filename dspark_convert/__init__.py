"""dspark-convert: turn DeepSeek DSpark drafters into Strata artifacts, and prove them right."""

__version__ = "0.1.0"
CONVERTER_NAME = "dspark-convert"
