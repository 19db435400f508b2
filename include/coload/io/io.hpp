#pragma once
// The io module: asynchronous file reads (io_uring with a pread fallback), and reads by URL
// (libcurl).

#include "coload/io/buffer.hpp"
#include "coload/io/errors.hpp"
#include "coload/io/file.hpp"
#include "coload/io/http.hpp"
#include "coload/io/reader.hpp"
#include "coload/io/whole_file.hpp"
