"""The results history: a database of every result (store), series of nights per point and
metric cut where the environment changed (series), change points in them (changes), and
the trend page (page). docs/history.md."""
