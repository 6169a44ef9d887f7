// The MPI backend's bounded waits and the probe that names silent ranks
// (mpi_collective_timeout.h).
#include "mpi_collective_timeout.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dufu/common/communicator.h"
#include "dufu/common/environment_seconds.h"
#include "dufu/common/error.h"

namespace dufu {

namespace {

// PyTorch's NCCL watchdog waits as long: far beyond any step, checkpoint or
// evaluation that keeps one rank busy while the others wait.
constexpr double kDefaultTimeoutSeconds = 600.0;
constexpr char kEnvironmentVariable[] = "DUFU_COLLECTIVE_TIMEOUT";
// How long a timed-out rank waits for replies. A waiting rank polls at least every
// millisecond, so a reply takes milliseconds even on a loaded machine; never longer
// than the timeout itself.
constexpr double kGraceSeconds = 1.0;
constexpr int kPingTag = 1;
constexpr int kReplyTag = 2;

struct TimeoutSetting {
  double seconds = kDefaultTimeoutSeconds;
  std::string source = kEnvironmentVariable;  // what the line tells the user to raise
  bool chosen = false;                        // by set_collective_timeout
};

TimeoutSetting& timeout_setting() {
  static TimeoutSetting setting;
  return setting;
}

MPI_Comm& probe_channel() {
  static MPI_Comm channel = MPI_COMM_NULL;
  return channel;
}

// A zero-byte message that nobody waits to see sent: the job ends soon after a ping,
// and a reply is only ever looked for by its receiver.
void send_and_forget(int world_rank, int tag) {
  MPI_Request request = MPI_REQUEST_NULL;
  if (MPI_Isend(nullptr, 0, MPI_BYTE, world_rank, tag, probe_channel(), &request) == MPI_SUCCESS) {
    MPI_Request_free(&request);
  }
}

// Replies to every ping that has arrived: this rank is alive and waiting.
void answer_probes() {
  if (probe_channel() == MPI_COMM_NULL) return;
  int arrived = 0;
  MPI_Status status;
  while (MPI_Iprobe(MPI_ANY_SOURCE, kPingTag, probe_channel(), &arrived, &status) == MPI_SUCCESS && arrived != 0) {
    MPI_Recv(nullptr, 0, MPI_BYTE, status.MPI_SOURCE, kPingTag, probe_channel(), MPI_STATUS_IGNORE);
    send_and_forget(status.MPI_SOURCE, kReplyTag);
  }
}

struct Member {
  int group_rank;
  int world_rank;
};

std::vector<Member> waited_for(const mpi_wait::WaitSubject& subject) {
  int rank = 0;
  int size = 0;
  MPI_Comm_rank(subject.comm, &rank);
  MPI_Comm_size(subject.comm, &size);
  std::vector<int> ranks;
  if (subject.collective) {
    for (int r = 0; r < size; ++r) {
      if (r != rank) ranks.push_back(r);
    }
  } else {
    for (const int peer : subject.peers) {
      if (peer != rank && std::find(ranks.begin(), ranks.end(), peer) == ranks.end()) ranks.push_back(peer);
    }
  }
  std::vector<int> world_ranks(ranks.size(), MPI_UNDEFINED);
  MPI_Group group = MPI_GROUP_NULL;
  MPI_Group world = MPI_GROUP_NULL;
  MPI_Comm_group(subject.comm, &group);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  MPI_Group_translate_ranks(group, static_cast<int>(ranks.size()), ranks.data(), world, world_ranks.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  std::vector<Member> members;
  for (std::size_t i = 0; i < ranks.size(); ++i) members.push_back(Member{ranks[i], world_ranks[i]});
  return members;
}

// The members that do not reply to a ping within the grace period.
std::vector<Member> silent_members(const std::vector<Member>& members, double grace_seconds) {
  std::vector<MPI_Request> replies(members.size(), MPI_REQUEST_NULL);
  for (std::size_t i = 0; i < members.size(); ++i) {
    MPI_Irecv(nullptr, 0, MPI_BYTE, members[i].world_rank, kReplyTag, probe_channel(), &replies[i]);
    send_and_forget(members[i].world_rank, kPingTag);
  }
  const mpi_wait::Backoff backoff;
  auto pending = [&] {
    return std::count_if(replies.begin(), replies.end(), [](MPI_Request r) { return r != MPI_REQUEST_NULL; });
  };
  while (pending() > 0 && backoff.elapsed_seconds() < grace_seconds) {
    answer_probes();  // the others are probing too
    for (MPI_Request& reply : replies) {
      int done = 0;
      if (reply != MPI_REQUEST_NULL && MPI_Test(&reply, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
        reply = MPI_REQUEST_NULL;  // a dead peer's channel fails: mpirun is ending the job anyway
      }
    }
    backoff.pause();
  }
  std::vector<Member> silent;
  for (std::size_t i = 0; i < members.size(); ++i) {
    if (replies[i] != MPI_REQUEST_NULL) silent.push_back(members[i]);
  }
  return silent;
}

// "rank 1", "ranks 0 (world rank 1) and 2 (world rank 5)".
std::string name_members(const std::vector<Member>& members) {
  std::string names = members.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < members.size(); ++i) {
    if (i > 0) names += i + 1 == members.size() ? " and " : ", ";
    names += std::to_string(members[i].group_rank);
    if (members[i].world_rank != members[i].group_rank) names += str_cat(" (world rank ", members[i].world_rank, ")");
  }
  return names;
}

[[noreturn]] void abort_naming_silent_ranks(const mpi_wait::WaitSubject& subject) {
  const TimeoutSetting& setting = timeout_setting();
  std::string who;
  if (probe_channel() == MPI_COMM_NULL) {
    who = "no probe channel to find out which rank did not answer";
  } else {
    const std::vector<Member> members = waited_for(subject);
    const std::vector<Member> silent = silent_members(members, std::min(kGraceSeconds, setting.seconds));
    if (!silent.empty()) {
      who = name_members(silent) + " did not answer";
    } else {
      who = str_cat(members.size() == 1 ? "rank " + std::to_string(members[0].group_rank) : std::string("every rank"),
                    " answered but waits in another operation: the ranks did not call the same operations in the "
                    "same order");
    }
  }
  abort_all(str_cat(subject.collective ? "collective " : "", subject.operation, " on '", subject.group,
                    "' timed out after ", setting.seconds, " s: ", who, " (", setting.source, ")"),
            1);
  std::_Exit(1);  // abort_all returns only when MPI is not running, which a wait rules out
}

}  // namespace

void set_collective_timeout(double seconds, std::string source) {
  if (!(seconds > 0.0) || !std::isfinite(seconds)) {
    DUFU_FAIL(source, " = ", seconds, " is not a positive number of seconds");
  }
  timeout_setting() = TimeoutSetting{seconds, std::move(source), true};
}

CollectiveTimeout collective_timeout() {
  mpi_wait::default_collective_timeout_from_environment();
  return CollectiveTimeout{.seconds = timeout_setting().seconds, .source = timeout_setting().source};
}

namespace mpi_wait {

double Backoff::elapsed_seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void Backoff::pause() const {
  const auto waited = std::chrono::steady_clock::now() - start_;
  if (waited < std::chrono::microseconds(50)) return;
  if (waited < std::chrono::milliseconds(1)) {
    std::this_thread::yield();
    return;
  }
  std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(waited / 8, std::chrono::milliseconds(1)));
}

void open_probe_channel() {
  if (probe_channel() != MPI_COMM_NULL) return;
  MPI_Comm channel = MPI_COMM_NULL;
  if (MPI_Comm_dup(MPI_COMM_WORLD, &channel) != MPI_SUCCESS) DUFU_FAIL("MPI_Comm_dup of the probe channel failed");
  MPI_Comm_set_errhandler(channel, MPI_ERRORS_RETURN);
  probe_channel() = channel;
}

void close_probe_channel() {
  if (probe_channel() != MPI_COMM_NULL) MPI_Comm_free(&probe_channel());
}

void default_collective_timeout_from_environment() {
  TimeoutSetting& setting = timeout_setting();
  if (!setting.chosen) setting.seconds = positive_seconds_from_environment(kEnvironmentVariable, kDefaultTimeoutSeconds);
}

int complete_or_abort(std::span<MPI_Request> requests, MPI_Status* statuses, const WaitSubject& subject) {
  const double timeout = timeout_setting().seconds;
  const Backoff backoff;
  for (;;) {
    bool complete = true;
    for (std::size_t i = 0; i < requests.size(); ++i) {
      if (requests[i] == MPI_REQUEST_NULL) continue;
      int done = 0;
      const int code = MPI_Test(&requests[i], &done, statuses == nullptr ? MPI_STATUS_IGNORE : &statuses[i]);
      if (code != MPI_SUCCESS) return code;
      complete = complete && done != 0;
    }
    if (complete) return MPI_SUCCESS;
    if (backoff.elapsed_seconds() > timeout) abort_naming_silent_ranks(subject);
    answer_probes();
    backoff.pause();
  }
}

}  // namespace mpi_wait

}  // namespace dufu
