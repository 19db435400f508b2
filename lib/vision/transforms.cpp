// vision/transforms: (in progress)
