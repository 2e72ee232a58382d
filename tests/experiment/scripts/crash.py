raise RuntimeError("the data file is missing")
