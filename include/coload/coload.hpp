#pragma once
// Everything coload offers, in one include.

#include "coload/collate/collate.hpp"
#include "coload/coro/coro.hpp"
#include "coload/dataset/dataset.hpp"
#include "coload/dataset/sample_context.hpp"
#include "coload/dataset/tensor_dataset.hpp"
#include "coload/exec/thread_executor.hpp"
#include "coload/exec/worker_info.hpp"
#include "coload/loader/data_loader.hpp"
#include "coload/loader/driver.hpp"
#include "coload/loader/epoch.hpp"
#include "coload/loader/errors.hpp"
#include "coload/loader/options.hpp"
#include "coload/sampler/batch.hpp"
#include "coload/sampler/random.hpp"
#include "coload/sampler/sampler.hpp"
#include "coload/sampler/sequential.hpp"
