// vision tests: folder (in progress)
