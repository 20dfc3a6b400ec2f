"""The rule engine: load rule files, evaluate them over a Run, select and configure them."""
