// HostBackend's streams and events: each stream is an ordered queue of
// tickets (completed at once, or by the test under manual completion), with
// host functions run as their ticket completes and event waits recorded.
#include "backends/mutex_lock.h"
#include "backends/host/host_backend.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace cma {


// ---------------------------------------------------------------- streams/events

absl::StatusOr<Stream> HostBackend::CreateStream(int device) {
  MutexLock l(&mu_);
  Count("CreateStream");
  if (auto s = CheckDevice(device); !s.ok()) return s;
  const Stream id = next_id_++;
  streams_[id] = StreamState{device};
  return id;
}

absl::Status HostBackend::DestroyStream(Stream stream) {
  MutexLock l(&mu_);
  Count("DestroyStream");
  if (stream == kDefaultStream) {
    return absl::InvalidArgumentError("DestroyStream: the default stream cannot be destroyed");
  }
  if (!streams_.erase(stream)) {
    return absl::InvalidArgumentError(absl::StrFormat("DestroyStream: unknown stream 0x%x", stream));
  }
  return absl::OkStatus();
}

absl::Status HostBackend::ValidateStream(int device, Stream stream) {
  MutexLock l(&mu_);
  Count("ValidateStream");
  if (auto s = CheckDevice(device); !s.ok()) return s;
  auto st = FindStream(stream);
  if (!st.ok()) return st.status();
  if ((*st)->device != -1 && (*st)->device != device) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "stream 0x%x belongs to device %d, not device %d", stream, (*st)->device, device));
  }
  return absl::OkStatus();
}

absl::Status HostBackend::SynchronizeStream(Stream stream) {
  MutexLock l(&mu_);
  Count("SynchronizeStream");
  return CompleteLocked(stream);
}

absl::StatusOr<bool> HostBackend::QueryStream(Stream stream) {
  MutexLock l(&mu_);
  Count("QueryStream");
  auto st = FindStream(stream);
  if (!st.ok()) return st.status();
  Settle(**st);
  if ((*st)->completed < (*st)->submitted) return false;
  return !AnswerBusy();
}

bool HostBackend::AnswerBusy() {
  if (options_.busy_query_percent <= 0) return false;
  // A fixed sequence (splitmix64 of a counter), so a replay is repeatable.
  std::uint64_t z = ++busy_draws_ * 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return static_cast<int>(z % 100) < options_.busy_query_percent;
}

absl::Status HostBackend::LaunchHostFunction(Stream stream, absl::AnyInvocable<void() &&> fn) {
  MutexLock l(&mu_);
  Count("LaunchHostFunction");
  auto st = FindStream(stream);
  if (!st.ok()) return st.status();
  (*st)->host_functions.emplace(++(*st)->submitted, std::move(fn));
  Advance(**st);
  Settle(**st);
  return absl::OkStatus();
}

absl::StatusOr<bool> HostBackend::IsCapturing(Stream stream) {
  MutexLock l(&mu_);
  Count("IsCapturing");
  auto st = FindStream(stream);
  if (!st.ok()) return st.status();
  return (*st)->capturing;
}

void HostBackend::Touch(const void* ptr, std::size_t bytes, int device) {
  MutexLock l(&mu_);
  auto a = FindManaged(const_cast<void*>(ptr), bytes);
  if (!a.ok() || !(*a)->reserved || !CheckDevice(device).ok()) return;
  auto it = --managed_.upper_bound(reinterpret_cast<std::uintptr_t>(ptr));
  PopulatePages(it->second, it->first, {const_cast<void*>(ptr), bytes},
                PlacementRecord::Op::kPrefetch, Location::Device(device));
}


absl::Status HostBackend::EnqueueWork(Stream stream) {
  MutexLock l(&mu_);
  auto st = FindStream(stream);
  if (!st.ok()) return st.status();
  ++(*st)->submitted;
  Advance(**st);
  return absl::OkStatus();
}

absl::Status HostBackend::CompleteWork(Stream stream) {
  MutexLock l(&mu_);
  return CompleteLocked(stream);
}

absl::Status HostBackend::CompleteLocked(Stream stream) {
  auto st = FindStream(stream);
  if (!st.ok()) return st.status();
  CompleteUpTo(stream, (*st)->submitted);
  return absl::OkStatus();
}

void HostBackend::CompleteUpTo(Stream stream, std::int64_t ticket, int depth) {
  auto st = streams_.find(stream);
  if (st == streams_.end() || st->second.completed >= ticket) return;
  StreamState& s = st->second;
  while (!s.waits.empty() && s.waits.begin()->first <= ticket) {
    const auto [on, on_ticket] = s.waits.begin()->second;
    s.waits.erase(s.waits.begin());
    // Waits refer to earlier positions, so this ends; the bound is a guard.
    if (depth < 64) CompleteUpTo(on, on_ticket, depth + 1);
  }
  s.completed = std::max(s.completed, ticket);
  RunCompletedHostFunctions(s);
}

void HostBackend::Settle(StreamState& s, int depth) {
  while (s.completed < s.submitted) {
    const std::int64_t unit = s.completed + 1;
    if (s.host_functions.count(unit) != 0) {  // nothing to wait for but what came before
      ++s.completed;
      RunCompletedHostFunctions(s);
      continue;
    }
    auto w = s.waits.find(unit);
    if (w == s.waits.end()) return;  // ordinary work: CompleteWork finishes it
    const auto [on_stream, ticket] = w->second;
    auto on = streams_.find(on_stream);
    if (on != streams_.end() && on->second.completed < ticket) {
      // Two streams may wait on each other's earlier positions: the bound
      // guards the recursion, which may also settle `s` itself.
      if (depth < 64) Settle(on->second, depth + 1);
      on = streams_.find(on_stream);
      if (on != streams_.end() && on->second.completed < ticket) return;
    }
    if (s.completed + 1 == unit) {
      s.waits.erase(unit);
      ++s.completed;
      RunCompletedHostFunctions(s);
    }
  }
}

HostBackend::StreamState* HostBackend::Settled(Stream stream) {
  auto st = streams_.find(stream);
  if (st == streams_.end()) return nullptr;
  Settle(st->second);
  return &st->second;
}

std::int64_t HostBackend::PendingWork(Stream stream) {
  MutexLock l(&mu_);
  StreamState* st = Settled(stream);
  return st != nullptr ? st->submitted - st->completed : 0;
}

absl::StatusOr<Event> HostBackend::CreateEvent(int device) {
  MutexLock l(&mu_);
  Count("CreateEvent");
  if (auto s = CheckDevice(device); !s.ok()) return s;
  const Event id = next_id_++;
  events_[id] = EventState{device};
  return id;
}

absl::Status HostBackend::DestroyEvent(Event event) {
  MutexLock l(&mu_);
  Count("DestroyEvent");
  if (!events_.erase(event)) {
    return absl::InvalidArgumentError(absl::StrFormat("DestroyEvent: unknown event 0x%x", event));
  }
  return absl::OkStatus();
}

absl::Status HostBackend::RecordEvent(Event event, Stream stream) {
  MutexLock l(&mu_);
  Count("RecordEvent");
  auto it = events_.find(event);
  if (it == events_.end()) {
    return absl::InvalidArgumentError(absl::StrFormat("RecordEvent: unknown event 0x%x", event));
  }
  auto st = FindStream(stream);
  if (!st.ok()) return st.status();
  it->second.stream = stream;
  it->second.ticket = (*st)->submitted;
  it->second.recorded = true;
  return absl::OkStatus();
}

absl::StatusOr<bool> HostBackend::QueryEvent(Event event) {
  MutexLock l(&mu_);
  Count("QueryEvent");
  auto it = events_.find(event);
  if (it == events_.end()) {
    return absl::InvalidArgumentError(absl::StrFormat("QueryEvent: unknown event 0x%x", event));
  }
  if (!it->second.recorded) return true;  // as CUDA: an unrecorded event is complete
  StreamState* st = Settled(it->second.stream);
  // A destroyed stream's work is considered finished.
  if (st != nullptr && st->completed < it->second.ticket) return false;
  return !AnswerBusy();
}

absl::Status HostBackend::SynchronizeEvent(Event event) {
  MutexLock l(&mu_);
  Count("SynchronizeEvent");
  auto it = events_.find(event);
  if (it == events_.end()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("SynchronizeEvent: unknown event 0x%x", event));
  }
  // The "device" finishes that work.
  if (it->second.recorded) CompleteUpTo(it->second.stream, it->second.ticket);
  return absl::OkStatus();
}

absl::Status HostBackend::StreamWaitEvent(Stream stream, Event event) {
  MutexLock l(&mu_);
  Count("StreamWaitEvent");
  auto st = FindStream(stream);
  if (!st.ok()) return st.status();
  auto ev = events_.find(event);
  if (ev == events_.end()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("StreamWaitEvent: unknown event 0x%x", event));
  }
  if (!ev->second.recorded) return absl::OkStatus();
  waits_.push_back({stream, ev->second.stream, ev->second.ticket, ++record_seq_});
  // Work queued on `stream` from now on completes only after the event's:
  // a unit of its own that the other stream's progress completes.
  StreamState* on = Settled(ev->second.stream);
  if (on != nullptr && on->completed < ev->second.ticket && ev->second.stream != stream) {
    StreamState& s = **st;
    s.waits[++s.submitted] = {ev->second.stream, ev->second.ticket};
    Advance(s);
  }
  return absl::OkStatus();
}

}  // namespace cma
