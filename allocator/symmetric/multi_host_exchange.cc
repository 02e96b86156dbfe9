// MakeMultiHostExchange (multi_host.h): each host's exchange below, the
// leaders' ByteExchange above, the token's proof and a MAC on every
// leaders' round between them.
//
// Set-up:
//   host round 1:   every process: {magic, version, global index, count, nonce}
//   host round 1b:  every process: HMAC(token, "cma-proc" version index
//                   SHA256(host round 1)); each process checks every other
//                   process of its host (the launcher's token is the proof of
//                   every process, not of the leaders alone: a host exchange
//                   may run on a token of its own, as MakeCallbackExchange's)
//   leaders round A: {magic, version, leader index, n, n global indices, nonce}
//   leaders round B: HMAC(token, "cma-lead" version index SHA256(transcript A))
//   leaders verdict: {ok, HMAC(token, "cma-vset" version index ok
//                    ok ? SHA256(A) : SHA256(this leader's message in A))}
//                   (a refusal too is bound to this set-up: to its sender's
//                   round-A message, with that leader's fresh nonce)
//   host round 2:   the leader: the host of every process, or its failure
// Each AllGather:
//   host round 1:   every process's contribution (FDs reach this host only)
//   leaders round:  {seq, this host's contributions, HMAC(session key,
//                    "cma-rnd" seq index payload)}
//   leaders verdict: {ok, HMAC(session key, "cma-vrnd" seq index ok
//                    SHA256(the round's messages))}
//   host round 2:   the leader: the other hosts' contributions, or its failure
#include <sodium.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "allocator/symmetric/multi_host.h"
#include "allocator/symmetric/socket_rendezvous.h"
#include "allocator/symmetric/wire.h"

namespace cma {
namespace {

constexpr std::uint32_t kSetupMagic = 0x434d4153;   // "CMAS": host round 1 of set-up
constexpr std::uint32_t kLeaderMagic = 0x434d414c;  // "CMAL": leaders' round A
// 3: every process proves the launcher's token to its host (host round 1b).
constexpr std::uint32_t kVersion = 3;
constexpr std::size_t kMac = crypto_auth_hmacsha256_BYTES;

template <typename T>
void Put(std::string& out, const T& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(v));
}
// A bounded reader: every Get checks that the bytes are there.
struct Reader {
  const std::string& in;
  std::size_t pos = 0;
  template <typename T>
  bool Get(T& v) {
    if (in.size() - pos < sizeof(v)) return false;
    std::memcpy(&v, in.data() + pos, sizeof(v));
    pos += sizeof(v);
    return true;
  }
  bool Bytes(std::size_t n, std::string& out) {
    if (in.size() - pos < n) return false;
    out.assign(in, pos, n);
    pos += n;
    return true;
  }
  bool Done() const { return pos == in.size(); }
};

// The leaders' proof over round A's transcript (every leader's message,
// each with its length): a leader's MAC covers every nonce, so it is good
// for this rendezvous only, and its index, so it is good for it alone.
std::string Transcript(const std::vector<std::string>& a) {
  std::string all;
  for (const std::string& m : a) {
    Put(all, static_cast<std::uint64_t>(m.size()));
    all += m;
  }
  unsigned char h[crypto_hash_sha256_BYTES];
  crypto_hash_sha256(h, reinterpret_cast<const unsigned char*>(all.data()), all.size());
  return std::string(reinterpret_cast<const char*>(h), sizeof(h));
}
std::string LeaderProof(const std::string& token, std::int32_t index, const std::string& hash) {
  std::string msg = "cma-lead";
  Put(msg, kVersion);
  Put(msg, index);
  return wire::HmacSha256(token, msg + hash);
}
// A process's proof to the others of its host: its global index and the
// host's round 1 (every process's nonce) under the launcher's token.
std::string ProcessProof(const std::string& token, std::int32_t index, const std::string& hash) {
  std::string msg = "cma-proc";
  Put(msg, kVersion);
  Put(msg, index);
  return wire::HmacSha256(token, msg + hash);
}
std::string RoundMac(const std::string& key, std::uint64_t seq, std::int32_t index,
                     absl::string_view payload) {
  std::string msg = "cma-rnd";
  Put(msg, kVersion);
  Put(msg, seq);
  Put(msg, index);
  msg.append(payload.data(), payload.size());
  return wire::HmacSha256(key, msg);
}

std::string Sha256(absl::string_view m) {
  unsigned char h[crypto_hash_sha256_BYTES];
  crypto_hash_sha256(h, reinterpret_cast<const unsigned char*>(m.data()), m.size());
  return std::string(reinterpret_cast<const char*>(h), sizeof(h));
}

// A leader's verdict on a round: ok or not, MAC'd under `key` and bound to
// the round (its label and number) and, if ok, to what this leader saw of
// it (a hash of the round's messages); a refusal, which stands whatever
// its sender saw, to `fresh` instead: something of this session that every
// leader knows of the sender alike (in set-up, whose key is the token, a
// hash of its round-A message with its fresh nonce; in a round, nothing:
// the session key binds it).
std::string VerdictMac(const std::string& key, absl::string_view label, std::uint64_t seq,
                       std::int32_t index, bool ok, const std::string& hash,
                       const std::string& fresh) {
  std::string msg(label);
  Put(msg, kVersion);
  Put(msg, seq);
  Put(msg, index);
  msg += ok ? '\1' : '\0';
  return wire::HmacSha256(key, msg + (ok ? hash : fresh));
}

// Host round 2's leader message: ok and a body, or a failure (code, reason).
std::string Success(const std::string& body) { return std::string(1, '\1') + body; }
std::string Failure(const absl::Status& s) {
  std::string out(1, '\0');
  Put(out, static_cast<std::uint32_t>(s.code()));
  return out + std::string(s.message().substr(0, wire::kMaxReasonBytes));
}
// The leader's message as a member reads it: its body, or its failure.
absl::StatusOr<std::string> FromLeader(const std::string& m) {
  if (m.empty()) return absl::DataLossError("symmetric exchange: an empty message from the leader");
  if (m[0] == '\1') return m.substr(1);
  Reader r{m, 1};
  std::uint32_t code = 0;
  if (m[0] != '\0' || !r.Get(code) || code == 0 ||
      code > static_cast<std::uint32_t>(absl::StatusCode::kUnauthenticated) ||
      m.size() - r.pos > wire::kMaxReasonBytes) {
    return absl::DataLossError("symmetric exchange: a malformed message from this host's leader");
  }
  return absl::Status(static_cast<absl::StatusCode>(code),
                      absl::StrCat("this host's leader reports: ", m.substr(r.pos)));
}

void CloseFds(std::vector<Contribution>& all) {
  for (Contribution& c : all) wire::CloseAll(c.fds);
}

class MultiHostExchange final : public Exchange {
 public:
  MultiHostExchange(std::unique_ptr<Exchange> host, std::unique_ptr<ByteExchange> leaders,
                    int index, int count)
      : host_(std::move(host)), leaders_(std::move(leaders)), index_(index), count_(count) {}

  int process_count() const override { return count_; }
  int process_index() const override { return index_; }
  int host_count() const override { return hosts_; }
  int host_of(int process) const override {
    return process >= 0 && process < count_ ? host_of_[process] : -1;
  }

  // The collective set-up (see the top of this file).
  absl::Status SetUp(const std::string& token) {
    absl::StatusOr<std::string> nonce = wire::RandomBytes(wire::kNonceBytes);
    if (!nonce.ok()) return Broken(nonce.status());
    Contribution me;
    Put(me.bytes, kSetupMagic);
    Put(me.bytes, kVersion);
    Put(me.bytes, static_cast<std::int32_t>(index_));
    Put(me.bytes, static_cast<std::int32_t>(count_));
    me.bytes += *nonce;
    absl::StatusOr<std::vector<Contribution>> local = host_->AllGather(me);
    if (!local.ok()) return Broken(local.status());
    CloseFds(*local);
    // Every process of this host checks the same bytes: they agree.
    std::vector<bool> seen(count_, false);
    for (std::size_t k = 0; k < local->size(); ++k) {
      Reader r{(*local)[k].bytes};
      std::uint32_t magic = 0, version = 0;
      std::int32_t g = -1, n = -1;
      std::string their_nonce;
      if (!r.Get(magic) || !r.Get(version) || !r.Get(g) || !r.Get(n) ||
          !r.Bytes(wire::kNonceBytes, their_nonce) || !r.Done() || magic != kSetupMagic ||
          version != kVersion) {
        return Broken(absl::DataLossError(absl::StrFormat(
            "symmetric exchange: host process %d is not a multi-host member of this version", k)));
      }
      if (n != count_ || g < 0 || g >= count_ || seen[g]) {
        return Broken(absl::InvalidArgumentError(absl::StrFormat(
            "symmetric exchange: host process %d says it is process %d of %d (this process: "
            "%d of %d); indices must be distinct and counts equal",
            k, g, n, index_, count_)));
      }
      seen[g] = true;
      local_.push_back(g);
    }
    // Host round 1b: every process's proof of the launcher's token, over
    // every nonce of this host (fresh for this set-up), checked by every
    // process of the host. The leader joins its host's verdict to the
    // leaders' proof, so that a process with another token fails every host.
    std::vector<std::string> firsts;
    for (const Contribution& c : *local) firsts.push_back(c.bytes);
    const std::string host_hash = Transcript(firsts);
    absl::StatusOr<std::vector<Contribution>> proofs =
        host_->AllGather({ProcessProof(token, index_, host_hash), {}});
    if (!proofs.ok()) return Broken(proofs.status());
    CloseFds(*proofs);
    absl::Status members = CheckMembers(token, *proofs, host_hash);
    std::string table;
    absl::Status status = members;
    if (leaders_ != nullptr) status = Leaders(token, &table, members);
    absl::StatusOr<std::vector<Contribution>> second =
        host_->AllGather({leaders_ != nullptr ? (status.ok() ? Success(table) : Failure(status))
                                              : std::string(),
                          {}});
    if (!second.ok()) return Broken(status.ok() ? second.status() : status);
    CloseFds(*second);
    // A process's own finding first (its leader reports the host's too).
    if (!members.ok()) return Broken(members);
    if (!status.ok()) return Broken(status);
    absl::StatusOr<std::string> body = FromLeader((*second)[0].bytes);
    if (!body.ok()) return Broken(body.status());
    // The table: the host count, then each process's host.
    Reader r{*body};
    std::int32_t hosts = 0;
    host_of_.assign(count_, -1);
    bool ok = r.Get(hosts) && hosts >= 1 && hosts <= count_;
    for (int p = 0; p < count_ && ok; ++p) {
      ok = r.Get(host_of_[p]) && host_of_[p] >= 0 && host_of_[p] < hosts;
    }
    ok = ok && r.Done();
    for (int g : local_) ok = ok && host_of_[g] == host_of_[index_];
    if (!ok) return Broken(absl::DataLossError("symmetric exchange: a malformed host table"));
    hosts_ = hosts;
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<Contribution>> AllGather(const Contribution& mine) override {
    if (!broken_.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "symmetric exchange: an earlier exchange failed (", broken_.message(), ")"));
    }
    absl::StatusOr<std::vector<Contribution>> local = host_->AllGather(mine);
    if (!local.ok()) return Broken(local.status());
    std::vector<Contribution> all(count_);
    for (std::size_t k = 0; k < local->size(); ++k) all[local_[k]] = std::move((*local)[k]);
    std::string remote;
    absl::Status status;
    if (leaders_ != nullptr) status = LeadersRound(all, &remote);
    absl::StatusOr<std::vector<Contribution>> second = host_->AllGather(
        {leaders_ != nullptr ? (status.ok() ? Success(remote) : Failure(status)) : std::string(),
         {}});
    if (second.ok()) CloseFds(*second);
    absl::Status failed = !status.ok() ? status : second.status();
    absl::StatusOr<std::string> body =
        failed.ok() ? FromLeader((*second)[0].bytes) : absl::StatusOr<std::string>(failed);
    // The other hosts' contributions, in process order.
    if (body.ok()) {
      Reader r{*body};
      for (int p = 0; p < count_ && failed.ok(); ++p) {
        if (host_of_[p] == host_of_[index_]) continue;
        std::uint32_t n = 0;
        if (!r.Get(n) || n > kMaxFrameBytes || !r.Bytes(n, all[p].bytes)) {
          failed = absl::DataLossError("symmetric exchange: malformed contributions from the leader");
        }
      }
      if (failed.ok() && !r.Done()) {
        failed = absl::DataLossError("symmetric exchange: malformed contributions from the leader");
      }
    } else {
      failed = body.status();
    }
    if (!failed.ok()) {
      CloseFds(all);
      return Broken(failed);
    }
    return all;
  }

 private:
  absl::Status Broken(absl::Status s) {
    if (broken_.ok()) broken_ = s;
    // The leaders hear of it at once, not at their timeout.
    leaders_.reset();
    return s;
  }

  // The leaders' verdict round: every leader says whether it accepted the
  // round, under `key`; a leader succeeds only if every leader did (fail
  // together: a message altered on its way to one leader fails them all).
  // `local`: this leader's own verdict. `fresh`: what binds each leader's
  // refusal to this session (VerdictMac), by leader index; empty: nothing
  // more than the key. A refusal whose binding differs does not verify, and
  // fails the round as such.
  absl::Status Verdict(const std::string& key, absl::string_view label, std::uint64_t seq,
                       const std::string& hash, absl::Status local,
                       const std::vector<std::string>& fresh = {}) {
    const int me = leaders_->index(), n = leaders_->count();
    const bool ok = local.ok();
    auto fresh_of = [&](int j) {
      return j >= 0 && static_cast<std::size_t>(j) < fresh.size() ? fresh[j] : std::string();
    };
    std::string v(1, ok ? '\1' : '\0');
    v += VerdictMac(key, label, seq, me, ok, hash, fresh_of(me));
    absl::StatusOr<std::vector<std::string>> got = leaders_->AllGather(v);
    if (!local.ok()) return local;
    if (!got.ok()) return got.status();
    if (static_cast<int>(got->size()) != n) {
      return absl::DataLossError("symmetric exchange: the leaders' verdict round lost messages");
    }
    std::vector<int> failed, unverified;
    for (int j = 0; j < n; ++j) {
      if (j == me) continue;
      const std::string& m = (*got)[j];
      const bool their_ok = m.size() == 1 + kMac && m[0] == '\1';
      if (m.size() != 1 + kMac || (m[0] != '\1' && m[0] != '\0') ||
          !wire::MacMatches(absl::string_view(m).substr(1),
                 VerdictMac(key, label, seq, j, their_ok, hash, fresh_of(j)))) {
        unverified.push_back(j);
      } else if (!their_ok) {
        failed.push_back(j);
      }
    }
    if (!unverified.empty()) {
      return absl::PermissionDeniedError(absl::StrFormat(
          "symmetric exchange: the verdict of leader%s %s on leaders' round %d does not verify "
          "(altered or injected, or that leader saw other messages): refused",
          unverified.size() > 1 ? "s" : "", absl::StrJoin(unverified, ", "), seq));
    }
    if (!failed.empty()) {
      return absl::AbortedError(absl::StrFormat(
          "symmetric exchange: leader%s %s refused leaders' round %d (see that host's error): "
          "failed on every host",
          failed.size() > 1 ? "s" : "", absl::StrJoin(failed, ", "), seq));
    }
    return absl::OkStatus();
  }

  // Host round 1b's checks: every other process of this host proved the
  // token over this host's round 1 (`hash`).
  absl::Status CheckMembers(const std::string& token, const std::vector<Contribution>& proofs,
                            const std::string& hash) const {
    if (proofs.size() != local_.size()) {
      return absl::DataLossError("symmetric exchange: the host's proof round lost messages");
    }
    std::vector<int> unproven;
    for (std::size_t k = 0; k < proofs.size(); ++k) {
      const int g = local_[k];
      if (g != index_ && !wire::MacMatches(proofs[k].bytes, ProcessProof(token, g, hash))) {
        unproven.push_back(g);
      }
    }
    if (unproven.empty()) return absl::OkStatus();
    return absl::PermissionDeniedError(absl::StrFormat(
        "symmetric exchange: process%s %s of this host did not prove that %s the launcher's "
        "rendezvous token (process %d checked; a wrong token on %s, or on this one if none "
        "verifies): refused on every host",
        unproven.size() > 1 ? "es" : "", absl::StrJoin(unproven, ", "),
        unproven.size() > 1 ? "they know" : "it knows", index_,
        unproven.size() > 1 ? "those" : "that process"));
  }

  // The leaders' proof (rounds A and B, then the verdict), then the host
  // table. `members`: this host's verdict on its processes' proofs, joined
  // to this leader's own.
  absl::Status Leaders(const std::string& token, std::string* table, const absl::Status& members) {
    const int me = leaders_->index();
    absl::StatusOr<std::string> nonce = wire::RandomBytes(wire::kNonceBytes);
    if (!nonce.ok()) return nonce.status();
    std::string a;
    Put(a, kLeaderMagic);
    Put(a, kVersion);
    Put(a, static_cast<std::int32_t>(me));
    Put(a, static_cast<std::uint32_t>(local_.size()));
    for (int g : local_) Put(a, static_cast<std::int32_t>(g));
    a += *nonce;
    absl::StatusOr<std::vector<std::string>> all_a = leaders_->AllGather(a);
    if (!all_a.ok()) return all_a.status();
    const std::string hash = Transcript(*all_a);
    absl::StatusOr<std::vector<std::string>> all_b =
        leaders_->AllGather(LeaderProof(token, me, hash));
    if (!all_b.ok()) return all_b.status();
    absl::Status local = CheckProof(token, a, *all_a, *all_b, hash, table);
    if (local.ok() && !members.ok()) local = members;
    // A refusal names its sender's round-A message (its fresh nonce with
    // it): this leader's own as sent, the others' as received.
    std::vector<std::string> fresh(leaders_->count());
    for (std::size_t j = 0; j < fresh.size() && j < all_a->size(); ++j) {
      fresh[j] = Sha256((*all_a)[j]);
    }
    fresh[me] = Sha256(a);
    return Verdict(token, "cma-vset", 0, hash, local, fresh);
  }

  // Set-up's checks: every proof, then the hosts' process lists.
  absl::Status CheckProof(const std::string& token, const std::string& a,
                          const std::vector<std::string>& all_a,
                          const std::vector<std::string>& all_b, const std::string& hash,
                          std::string* table) {
    const int me = leaders_->index(), n = leaders_->count();
    if (static_cast<int>(all_a.size()) != n || all_a[me] != a) {
      return absl::DataLossError("symmetric exchange: the leaders' exchange lost this leader's message");
    }
    std::vector<int> unproven;
    for (int j = 0; j < n; ++j) {
      if (j != me && (static_cast<int>(all_b.size()) != n ||
                      !wire::MacMatches(all_b[j], LeaderProof(token, j, hash)))) {
        unproven.push_back(j);
      }
    }
    if (!unproven.empty()) {
      return absl::PermissionDeniedError(absl::StrFormat(
          "symmetric exchange: the leader%s of host%s %s did not prove that %s the rendezvous "
          "token (host %d's leader checked; a wrong token on that host, or on this one if no "
          "host verifies): no handle crosses between them",
          unproven.size() > 1 ? "s" : "", unproven.size() > 1 ? "s" : "",
          absl::StrJoin(unproven, ", "), unproven.size() > 1 ? "they know" : "it knows", me));
    }
    key_ = wire::HmacSha256(token, "cma-sess" + hash);
    // Proven: now the hosts' process lists are the leaders' word.
    host_of_.assign(count_, -1);
    for (int j = 0; j < n; ++j) {
      Reader r{all_a[j]};
      std::uint32_t magic = 0, version = 0, k = 0;
      std::int32_t idx = -1;
      bool ok = r.Get(magic) && r.Get(version) && r.Get(idx) && r.Get(k) &&
                magic == kLeaderMagic && version == kVersion && idx == j && k >= 1 &&
                k <= static_cast<std::uint32_t>(count_);
      for (std::uint32_t i = 0; i < k && ok; ++i) {
        std::int32_t g = -1;
        ok = r.Get(g) && g >= 0 && g < count_;
        if (ok && host_of_[g] != -1) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "symmetric exchange: process %d is claimed by hosts %d and %d", g, host_of_[g], j));
        }
        if (ok) host_of_[g] = j;
      }
      std::string their_nonce;
      if (!ok || !r.Bytes(wire::kNonceBytes, their_nonce) || !r.Done()) {
        return absl::DataLossError(
            absl::StrFormat("symmetric exchange: a malformed first message from leader %d", j));
      }
    }
    std::vector<int> missing;
    for (int p = 0; p < count_; ++p) {
      if (host_of_[p] == -1) missing.push_back(p);
    }
    if (!missing.empty()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "symmetric exchange: process%s %s of %d %s on no host (every host's processes "
          "together must be 0 to %d)",
          missing.size() > 1 ? "es" : "", absl::StrJoin(missing, ", "), count_,
          missing.size() > 1 ? "are" : "is", count_ - 1));
    }
    Put(*table, static_cast<std::int32_t>(n));
    for (int p = 0; p < count_; ++p) Put(*table, host_of_[p]);
    return absl::OkStatus();
  }

  // One leaders' round: this host's contributions out, the others' in
  // (each checked against its leader's MAC), as host round 2's body; then
  // the verdict round, so that the round fails on every host or on none.
  absl::Status LeadersRound(const std::vector<Contribution>& all, std::string* remote) {
    const int me = leaders_->index();
    const std::uint64_t seq = ++seq_;
    std::string payload;
    Put(payload, seq);
    for (int g : local_) {
      Put(payload, static_cast<std::uint32_t>(all[g].bytes.size()));
      payload += all[g].bytes;
    }
    absl::Status local;
    std::string out;
    if (payload.size() + kMac > kMaxFrameBytes) {
      // Still take part (an empty message, which no leader accepts), so that
      // every leader hears of it in this round's verdict.
      local = absl::ResourceExhaustedError(absl::StrFormat(
          "symmetric exchange: this host's contributions (%d bytes) exceed the frame limit %d",
          payload.size(), kMaxFrameBytes));
    } else {
      out = payload + RoundMac(key_, seq, me, payload);
    }
    absl::StatusOr<std::vector<std::string>> got = leaders_->AllGather(out);
    if (!got.ok()) return local.ok() ? got.status() : local;
    const std::string hash = Transcript(*got);
    if (local.ok()) local = CheckRound(all, seq, *got, remote);
    return Verdict(key_, "cma-vrnd", seq, hash, local);
  }

  // A leaders' round's checks: every MAC, every message's form, and the
  // frame limit of every host's host round 2 (the same check on every
  // leader, so that none accepts what another must refuse).
  absl::Status CheckRound(const std::vector<Contribution>& all, std::uint64_t seq,
                          const std::vector<std::string>& got, std::string* remote) {
    const int me = leaders_->index(), n = leaders_->count();
    if (static_cast<int>(got.size()) != n) {
      return absl::DataLossError("symmetric exchange: the leaders' round lost messages");
    }
    std::vector<std::string> bytes(count_);
    for (int g : local_) bytes[g] = all[g].bytes;
    for (int j = 0; j < n; ++j) {
      if (j == me) continue;
      const std::string& m = got[j];
      if (m.size() < sizeof(seq) + kMac ||
          !wire::MacMatches(absl::string_view(m).substr(m.size() - kMac),
                 RoundMac(key_, seq, j, absl::string_view(m).substr(0, m.size() - kMac)))) {
        return absl::PermissionDeniedError(absl::StrFormat(
            "symmetric exchange: leader %d's message in round %d does not carry its MAC under "
            "the session's key (injected, replayed or altered on the way): refused",
            j, seq));
      }
      const std::string body = m.substr(0, m.size() - kMac);
      Reader r{body};
      std::uint64_t their_seq = 0;
      bool ok = r.Get(their_seq) && their_seq == seq;
      for (int p = 0; p < count_ && ok; ++p) {
        if (host_of_[p] != j) continue;
        std::uint32_t len = 0;
        ok = r.Get(len) && len <= kMaxFrameBytes && r.Bytes(len, bytes[p]);
      }
      if (!ok || !r.Done()) {
        return absl::DataLossError(
            absl::StrFormat("symmetric exchange: a malformed round from leader %d", j));
      }
    }
    // Every host's host round 2 carries the others' contributions: each must
    // fit a frame (its leader's Success byte included).
    std::vector<std::size_t> own(n, 0);
    std::size_t sum = 0;
    for (int p = 0; p < count_; ++p) {
      own[host_of_[p]] += sizeof(std::uint32_t) + bytes[p].size();
      sum += sizeof(std::uint32_t) + bytes[p].size();
    }
    for (int h = 0; h < n; ++h) {
      if (sum - own[h] + 1 > kMaxFrameBytes) {
        return absl::ResourceExhaustedError(absl::StrFormat(
            "symmetric exchange: host %d's share of round %d (the other hosts' contributions, "
            "%d bytes) exceeds the frame limit %d: refused on every host",
            h, seq, sum - own[h], kMaxFrameBytes));
      }
    }
    for (int p = 0; p < count_; ++p) {
      if (host_of_[p] == me) continue;
      Put(*remote, static_cast<std::uint32_t>(bytes[p].size()));
      *remote += bytes[p];
    }
    return absl::OkStatus();
  }

  const std::unique_ptr<Exchange> host_;
  std::unique_ptr<ByteExchange> leaders_;  // the leader's; null elsewhere (and once broken)
  const int index_;
  const int count_;
  int hosts_ = 1;
  std::vector<int> local_;     // this host's processes, by host-exchange index
  std::vector<int> host_of_;   // every process's host
  std::string key_;            // the leaders' session key
  std::uint64_t seq_ = 0;
  absl::Status broken_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Exchange>> MakeMultiHostExchange(
    std::unique_ptr<Exchange> host, std::unique_ptr<ByteExchange> leaders, int process_index,
    int process_count, const std::string& token) {
  if (absl::Status s = rendezvous::CheckMember(process_index, process_count); !s.ok()) return s;
  if (absl::Status s = wire::CheckToken(token); !s.ok()) return s;
  if (absl::Status s = wire::CryptoReady(); !s.ok()) return s;
  if (host == nullptr || host->process_count() > process_count) {
    return absl::InvalidArgumentError(
        "symmetric exchange: a multi-host exchange needs this host's exchange, of at most "
        "process_count processes");
  }
  const bool leader = host->process_index() == 0;
  if (leader != (leaders != nullptr) ||
      (leaders != nullptr && leaders->count() > process_count)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "symmetric exchange: process %d is %s of its host, so it %s a leaders' exchange (of at "
        "most process_count leaders)",
        process_index, leader ? "process 0 (the leader)" : "not the leader",
        leader ? "needs" : "must not have"));
  }
  auto x = std::make_unique<MultiHostExchange>(std::move(host), std::move(leaders), process_index,
                                               process_count);
  if (absl::Status s = x->SetUp(token); !s.ok()) return s;
  return std::unique_ptr<Exchange>(std::move(x));
}

}  // namespace cma
