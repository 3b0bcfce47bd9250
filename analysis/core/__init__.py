"""The bottom floor: the events frame's contract, the data model of a loaded run, step
selection, interval arithmetic and the names of collective ops. Imports nothing of the analysis."""
