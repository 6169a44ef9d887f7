// Runs `dataprep` as a child process the way the fault-injection and limit tests need:
// with a file size limit (RLIMIT_FSIZE, SIGXFSZ ignored, so writes fail with EFBIG
// as on a full disk, or left as a shell leaves it), an address-space limit, extra environment (DUFU_CRASH_POINT),
// stdin from a file or a pipe the test keeps open; then signals it, waits with a
// deadline and reports its exit, output and peak RSS (wait4).
//
// The tool is DUFU_DATAPREP_TOOL, or $DUFU_TEST_DATAPREP when set, so that the same
// tests can be run against an older build to show that they fail there.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>


namespace dufu::testing {

inline std::string dataprep_under_test() {
  const char* other = std::getenv("DUFU_TEST_DATAPREP");
  return other != nullptr && other[0] != '\0' ? other : DUFU_DATAPREP_TOOL;
}

// True in a sanitizer build, where address-space limits cannot be used (the shadow
// memory alone is terabytes of address space) and memory use is a few times higher.
constexpr bool kSanitized =
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    true;
#else
    false;
#endif

struct ToolOptions {
  std::optional<rlim_t> file_size_limit = std::nullopt;      // bytes; SIGXFSZ ignored
  bool file_size_signal_as_shell_leaves_it = false;          // with the limit: SIGXFSZ at its default
  std::optional<rlim_t> address_space_limit = std::nullopt;  // bytes; ignored in sanitizer builds
  std::vector<std::string> environment = {};                 // extra "NAME=value"
  std::string stdin_path = "/dev/null";
  int stdin_fd = -1;  // used instead of stdin_path when >= 0
};

struct ToolResult {
  int exit_code = -1;  // 128 + signal if a signal ended it, -2 if it was killed at the deadline
  std::string output;  // stdout and stderr
  long max_rss_kb = 0;
};

class ToolProcess {
 public:
  // Starts the tool with `arguments`. Its output comes back through a pipe, which
  // no file size limit applies to, so even the message of a write that failed on
  // the limit arrives whole.
  explicit ToolProcess(const std::vector<std::string>& arguments, const ToolOptions& options = {}) {
    std::vector<std::string> argv_strings{dataprep_under_test()};
    argv_strings.insert(argv_strings.end(), arguments.begin(), arguments.end());
    std::vector<char*> argv;
    for (auto& argument : argv_strings) argv.push_back(argument.data());
    argv.push_back(nullptr);
    // Info lines (which tokenizer was loaded, ...) would mix with what the tests read:
    // warnings and errors only, unless a test asks for more.
    std::vector<std::string> env_strings{"DUFU_LOG_LEVEL=warn"};
    for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
    env_strings.insert(env_strings.end(), options.environment.begin(), options.environment.end());
    std::vector<char*> envp;
    for (auto& entry : env_strings) envp.push_back(entry.data());
    envp.push_back(nullptr);

    int output[2];
    if (::pipe2(output, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      const int in = options.stdin_fd >= 0 ? options.stdin_fd : ::open(options.stdin_path.c_str(), O_RDONLY);
      if (in < 0 || ::dup2(in, 0) < 0 || ::dup2(output[1], 1) < 0 || ::dup2(output[1], 2) < 0) ::_exit(120);
      // Every other descriptor (the test's end of a stdin pipe) must not stay open here.
      for (int fd = 3; fd < 1024; ++fd) ::close(fd);
      // As a shell starts a foreground job, whatever the test runner ignores.
      for (const int signal_number : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) ::signal(signal_number, SIG_DFL);
      if (options.file_size_limit) {
        // Ignored, it stays so across exec: writes fail with EFBIG whatever the tool does.
        ::signal(SIGXFSZ, options.file_size_signal_as_shell_leaves_it ? SIG_DFL : SIG_IGN);
        const rlimit limit{*options.file_size_limit, *options.file_size_limit};
        if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) ::_exit(121);
      }
      if (options.address_space_limit && !kSanitized) {
        const rlimit limit{*options.address_space_limit, *options.address_space_limit};
        if (::setrlimit(RLIMIT_AS, &limit) != 0) ::_exit(122);
      }
      ::execve(argv[0], argv.data(), envp.data());
      ::_exit(123);
    }
    ::close(output[1]);
    reader_ = std::thread([this, fd = output[0]] {
      char buffer[4096];
      for (;;) {
        const ssize_t n = ::read(fd, buffer, sizeof(buffer));
        if (n > 0) {
          output_.append(buffer, static_cast<std::size_t>(n));
        } else if (n == 0 || errno != EINTR) {
          break;
        }
      }
      ::close(fd);
    });
  }
  ToolProcess(const ToolProcess&) = delete;
  ToolProcess& operator=(const ToolProcess&) = delete;
  ~ToolProcess() {
    if (pid_ > 0 && !waited_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (reader_.joinable()) reader_.join();
  }

  pid_t pid() const { return pid_; }
  void signal(int signal_number) const { ::kill(pid_, signal_number); }

  // Waits (killing it after `deadline`) and collects the result.
  ToolResult wait(std::chrono::seconds deadline = std::chrono::seconds(300)) {
    ToolResult result;
    const auto until = std::chrono::steady_clock::now() + deadline;
    int status = 0;
    rusage usage{};
    bool killed = false;
    for (;;) {
      const pid_t done = ::wait4(pid_, &status, WNOHANG, &usage);
      if (done == pid_) break;
      if (done < 0) throw std::runtime_error("wait4 failed");
      if (!killed && std::chrono::steady_clock::now() > until) {
        ::kill(pid_, SIGKILL);
        killed = true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    waited_ = true;
    result.exit_code = killed ? -2 : WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    result.max_rss_kb = usage.ru_maxrss;
    // The pipe closes when the tool and everything it started are gone.
    if (reader_.joinable()) reader_.join();
    result.output = output_;
    return result;
  }

 private:
  std::thread reader_;
  std::string output_;
  pid_t pid_ = -1;
  bool waited_ = false;
};

inline ToolResult run_tool(const std::vector<std::string>& arguments, const ToolOptions& options = {}) {
  ToolProcess process(arguments, options);
  return process.wait();
}

// Polls until `condition` holds or `timeout` passes; the condition's last value.
template <typename Condition>
bool eventually(Condition condition, std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > until) return condition();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

}  // namespace dufu::testing
