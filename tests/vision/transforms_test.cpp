// vision tests: transforms (in progress)
