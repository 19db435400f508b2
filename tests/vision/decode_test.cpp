// vision tests: decode (in progress)
