// The sidecar of one output of a preprocess job (preprocess_sidecar.h).
#include "preprocess_sidecar.h"

namespace dufu::dataprep {

ShardSidecar preprocess_sidecar(const PreprocessOptions& options, const PreprocessSetup& setup, std::size_t key) {
  ShardSidecar sidecar;
  sidecar.tokenizer = setup.tokenizer_record;
  sidecar.dtype = setup.dtype;
  const std::int64_t eod = setup.eod ? *setup.eod : options.eod_id.value_or(setup.tokenizer.eod_id());
  if (eod >= 0) sidecar.eod_id = eod;
  sidecar.append_eod = options.append_eod;
  sidecar.json_keys = options.reader.json_keys;
  if (key < sidecar.json_keys.size()) sidecar.json_key = sidecar.json_keys[key];
  return sidecar;
}

}  // namespace dufu::dataprep
