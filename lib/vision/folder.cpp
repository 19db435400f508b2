// vision/folder: (in progress)
