// Which reader a table input gets, and what a build without Arrow says (table_input.h).
#include "table_input.h"

#include "dufu/common/error.h"
#include "dufu/common/read_only_file.h"

#if DUFU_HAVE_ARROW
#include "arrow_batch_rows.h"
#endif

namespace dufu::dataprep {

std::string table_input_missing() {
#if DUFU_HAVE_ARROW
  return "";
#else
  return "this build of dufu reads no Parquet or Arrow files (" DUFU_ARROW_MISSING
         "); HINT: scripts/build.sh installs Arrow's libraries from the pinned pyarrow wheel (scripts/setup_arrow.sh) "
         "and builds with them";
#endif
}

std::unique_ptr<TableRows> open_table_rows(const InputRange& input, InputFormat format, const ReaderOptions& options) {
#if DUFU_HAVE_ARROW
  // A FIFO or a device (/dev/zero) is refused in one line here, before Arrow would
  // wait on it; Arrow opens the file again by name.
  (void)ReadOnlyFile::open(input.path);
  if (format == InputFormat::kParquet) return open_parquet_rows(input, options);
  if (format == InputFormat::kArrow) return open_arrow_ipc_rows(input, options);
  DUFU_FAIL("internal error: ", input.path, " opened as a table");
#else
  (void)format;
  (void)options;
  DUFU_FAIL(input.path, ": ", table_input_missing());
#endif
}

}  // namespace dufu::dataprep
