"""One folder per notebook (generate/ 01, extract/ 02a and 02b, train/ 03, evaluate/ 04,
drift/ 05, audit/ 06) plus shared/; each notebook's cells, and ``eagle3nb.run``, call its step."""
