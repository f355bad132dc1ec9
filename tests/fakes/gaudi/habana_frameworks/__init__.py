"""STAND-IN for Intel Gaudi's ``habana_frameworks`` package, for hwbench's tests only: it
drives no Gaudi. See habana_frameworks/torch/__init__.py."""
