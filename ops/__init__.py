"""The top floor: the `bandgate` command line and the operator tools (dlq, stats, doctor, the
private dev broker). Imports every floor below; nothing imports it."""
