// A Python Sampler: the recipe that makes its C++ sampler, and the instance the
// Python object itself walks. Shared by samplers.cc and loader.cc.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "dufu/dataprep/sampler.h"

namespace dufu::python {

struct SamplerRecipe {
  std::function<std::unique_ptr<dataprep::Sampler>()> make;
  std::string description;
  std::unique_ptr<dataprep::Sampler> instance;
};

}  // namespace dufu::python
