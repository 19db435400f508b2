// vision/decode: (in progress)
