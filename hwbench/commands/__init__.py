"""One module per `hwbench` subcommand: its parser (configure), the call into the
library and what it prints (main). The only code in hwbench that parses argv or
prints for the user, apart from the progress display (hwbench.harness.progress)."""
