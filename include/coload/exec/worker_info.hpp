#pragma once
// WorkerInfo moved to core/ (it is what every stage shares); this header stays for the code
// that includes it from here.

#include "coload/core/worker_info.hpp"
