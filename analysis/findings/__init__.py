"""What the tables mean: the bottleneck findings with their advice, and the stop diagnosis of a
run that did not end well."""
