// `train plot`: the loss curves of a run as a PNG, drawn by Debian's gnuplot so dufu
// needs no plotting library. The run's metrics.jsonl becomes two data files (train
// loss per step, validation loss per evaluation) in a scratch directory; gnuplot
// renders to a temporary name beside the output, which is renamed into place only
// once it is a complete PNG.
#include <fcntl.h>
#include <simdjson.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "commands.h"
#include "dufu/common/error.h"

extern char** environ;

namespace dufu::tools {
namespace {

namespace fs = std::filesystem;

struct PlotFlags {
  std::string input;
  std::string output;
  std::string title;
};

// Loss by step; nullopt where the run logged null (a non-finite value), drawn as a
// gap. A step logged twice keeps the later value (a resumed run repeats the steps
// after its checkpoint; the training loop drops the old records, but a file pieced
// together by hand may hold both).
using Series = std::map<std::int64_t, std::optional<double>>;

struct Metrics {
  Series train;
  Series eval;
  std::size_t train_records = 0;
};

// The field `key` as a number, or nullopt for null. Throws naming file:line when it
// is missing or of another type.
std::optional<double> number_field(simdjson::dom::object record, std::string_view key, const std::string& where) {
  simdjson::dom::element value;
  if (record[key].get(value) != simdjson::SUCCESS) DUFU_FAIL(where, ": the record has no \"", key, "\"");
  if (value.is_null()) return std::nullopt;
  double number = 0.0;
  if (value.get_double().get(number) != simdjson::SUCCESS) {
    DUFU_FAIL(where, ": \"", key, "\" is ", simdjson::to_string(value), ", not a number or null");
  }
  return number;
}

std::int64_t step_field(simdjson::dom::object record, const std::string& where) {
  std::int64_t step = 0;
  if (record["step"].get_int64().get(step) != simdjson::SUCCESS) {
    DUFU_FAIL(where, ": \"step\" is missing or not an integer");
  }
  return step;
}

Metrics read_metrics(const std::string& path) {
  std::ifstream in(path);
  if (!in) DUFU_FAIL("cannot open '", path, "': ", errno_message(errno));
  Metrics metrics;
  simdjson::dom::parser parser;
  std::string line;
  for (std::size_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = str_cat(path, ":", number);
    simdjson::dom::element element;
    if (const auto error = parser.parse(line).get(element); error != simdjson::SUCCESS) {
      DUFU_FAIL(where, ": not valid JSON (", simdjson::error_message(error), ")");
    }
    simdjson::dom::object record;
    if (element.get_object().get(record) != simdjson::SUCCESS) DUFU_FAIL(where, ": not a JSON object");
    std::string_view type;
    if (record["type"].get_string().get(type) != simdjson::SUCCESS) {
      DUFU_FAIL(where, ": the record has no \"type\" string");
    }
    // Other record types are not losses; leave them to other readers.
    if (type == "train") {
      metrics.train[step_field(record, where)] = number_field(record, "loss", where);
      ++metrics.train_records;
    } else if (type == "eval") {
      metrics.eval[step_field(record, where)] = number_field(record, "val_loss", where);
    }
  }
  if (in.bad()) DUFU_FAIL("error reading '", path, "': ", errno_message(errno));
  return metrics;
}

std::size_t count_finite(const Series& series) {
  std::size_t count = 0;
  for (const auto& [step, value] : series) count += value && std::isfinite(*value);
  return count;
}

// gnuplot data: "step loss" lines, a blank line for each gap so lines break there.
void write_series(const std::string& path, const Series& series) {
  std::FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) DUFU_FAIL("cannot write '", path, "': ", errno_message(errno));
  for (const auto& [step, value] : series) {
    if (value && std::isfinite(*value)) {
      std::fprintf(file, "%lld %.9g\n", static_cast<long long>(step), *value);
    } else {
      std::fprintf(file, "\n");
    }
  }
  if (std::fclose(file) != 0) DUFU_FAIL("cannot write '", path, "': ", errno_message(errno));
}

// A gnuplot single-quoted string: only the quote itself needs escaping, by doubling.
std::string quoted(const std::string& text) {
  std::string out = "'";
  for (const char c : text) {
    if (c == '\'') out += '\'';
    if (c != '\n') out += c;
  }
  return out + "'";
}

// A scratch directory for the data files, script and gnuplot's messages.
class ScratchDir {
 public:
  ScratchDir() {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base != nullptr && base[0] != '\0' ? base : "/tmp") + "/dufu-plot.XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) DUFU_FAIL("cannot create '", pattern, "': ", errno_message(errno));
    path_ = pattern;
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  ~ScratchDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Removes a file on scope exit unless released.
class RemoveOnExit {
 public:
  explicit RemoveOnExit(std::string path) : path_(std::move(path)) {}
  RemoveOnExit(const RemoveOnExit&) = delete;
  RemoveOnExit& operator=(const RemoveOnExit&) = delete;
  ~RemoveOnExit() {
    if (path_.empty()) return;
    std::error_code ignored;
    fs::remove(path_, ignored);
  }
  void release() { path_.clear(); }

 private:
  std::string path_;
};

// Runs `gnuplot script` with stdin from /dev/null and stdout and stderr into `log`;
// returns the exit status. Throws when gnuplot cannot be started.
int run_gnuplot(const std::string& script, const std::string& log) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  std::string program = "gnuplot";
  std::vector<char*> argv = {program.data(), const_cast<char*>(script.c_str()), nullptr};
  pid_t pid = 0;
  const int spawn_error = ::posix_spawnp(&pid, "gnuplot", &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawn_error == ENOENT) {
    DUFU_FAIL("gnuplot is not installed (not found on PATH); HINT: install gnuplot-nox (apt-get install ",
              "gnuplot-nox) or plot metrics.jsonl with another program");
  }
  if (spawn_error != 0) DUFU_FAIL("cannot run gnuplot: ", errno_message(spawn_error));
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) DUFU_FAIL("waiting for gnuplot: ", errno_message(errno));
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + WTERMSIG(status);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

bool is_png(const std::string& path) {
  static constexpr char kSignature[] = "\x89PNG\r\n\x1a\n";
  std::ifstream in(path, std::ios::binary);
  char head[8] = {};
  return in.read(head, 8) && std::string_view(head, 8) == std::string_view(kSignature, 8);
}

void run(const PlotFlags& flags) {
  std::error_code error;
  const bool is_dir = fs::is_directory(flags.input, error);
  const fs::path metrics_path = is_dir ? fs::path(flags.input) / "metrics.jsonl" : fs::path(flags.input);
  if (!fs::exists(metrics_path, error)) {
    DUFU_FAIL("'", metrics_path.string(), "' does not exist; HINT: give a run directory (run.dir of the ",
              "training config) or its metrics.jsonl");
  }
  const Metrics metrics = read_metrics(metrics_path.string());
  if (metrics.train_records == 0) {
    DUFU_FAIL("'", metrics_path.string(), "' has no train records (lines with \"type\":\"train\"); HINT: the ",
              "training loop writes one per step, so the run has not finished a step yet");
  }
  const std::size_t train_points = count_finite(metrics.train);
  if (train_points == 0) DUFU_FAIL("'", metrics_path.string(), "': every train loss is null (not finite)");
  const std::size_t eval_points = count_finite(metrics.eval);

  const fs::path output = flags.output.empty() ? metrics_path.parent_path() / "loss.png" : fs::path(flags.output);
  const fs::path output_dir = output.has_parent_path() ? output.parent_path() : fs::path(".");
  if (!fs::is_directory(output_dir, error)) {
    DUFU_FAIL("the output directory '", output_dir.string(), "' does not exist");
  }
  // The temporary PNG is created here, not by gnuplot, so that a directory it cannot
  // write in is one line naming it rather than gnuplot's script excerpt.
  const std::string temp_png = (output_dir / str_cat(".", output.filename().string(), ".tmp.", ::getpid())).string();
  const int temp_fd = ::open(temp_png.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (temp_fd < 0) {
    DUFU_FAIL("cannot write in the output directory '", output_dir.string(), "': ", errno_message(errno));
  }
  ::close(temp_fd);
  RemoveOnExit remove_temp(temp_png);
  const std::string title = flags.title.empty()
                                ? str_cat("loss: ", fs::weakly_canonical(metrics_path, error).parent_path().string())
                                : flags.title;

  ScratchDir scratch;
  write_series(scratch.file("train.dat"), metrics.train);
  if (eval_points > 0) write_series(scratch.file("eval.dat"), metrics.eval);

  // One point alone would be an invisible line: draw points when there are few.
  const char* train_style = train_points < 2 ? "points pt 7" : "lines lw 1.5";
  std::string script;
  script += "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n";
  script += "  set terminal pngcairo size 1000,600 noenhanced\n";
  script += "} else {\n";
  script += "  set terminal png size 1000,600 noenhanced\n";
  script += "}\n";
  script += "set output " + quoted(temp_png) + "\n";
  script += "set title " + quoted(title) + "\n";
  script += "set xlabel 'step'\nset ylabel 'loss'\nset grid\nset key top right\n";
  script += str_cat("plot ", quoted(scratch.file("train.dat")), " using 1:2 with ", train_style, " title 'train loss'");
  if (eval_points > 0) {
    script += str_cat(", ", quoted(scratch.file("eval.dat")),
                      " using 1:2 with linespoints pt 7 lw 1.5 title 'validation loss'");
  }
  script += "\nset output\n";
  {
    std::ofstream out(scratch.file("plot.gp"));
    out << script;
    if (!out.flush()) DUFU_FAIL("cannot write the gnuplot script in ", scratch.file(""));
  }

  const int status = run_gnuplot(scratch.file("plot.gp"), scratch.file("gnuplot.log"));
  const std::string messages = read_text(scratch.file("gnuplot.log"));
  if (status != 0) DUFU_FAIL("gnuplot failed (exit status ", status, "):\n", messages);
  if (!is_png(temp_png)) DUFU_FAIL("gnuplot wrote no PNG to '", temp_png, "':\n", messages);
  if (!messages.empty()) std::fprintf(stderr, "gnuplot: %s", messages.c_str());
  fs::rename(temp_png, output, error);
  if (error) DUFU_FAIL("cannot rename '", temp_png, "' to '", output.string(), "': ", error.message());
  remove_temp.release();
  std::printf("wrote %s: %zu train points, %zu validation points\n", output.string().c_str(), train_points,
              eval_points);
}

}  // namespace

void add_plot_command(CLI::App& app) {
  auto flags = std::make_shared<PlotFlags>();
  auto* command = app.add_subcommand("plot", "Plot a run's train and validation loss to a PNG with gnuplot");
  command->add_option("run", flags->input, "Run directory, or its metrics.jsonl")->required();
  command->add_option("--output,-o", flags->output, "PNG to write (default: loss.png beside metrics.jsonl)");
  command->add_option("--title", flags->title, "Plot title (default: the run directory)");
  command->callback([flags] { run(*flags); });
}

}  // namespace dufu::tools
