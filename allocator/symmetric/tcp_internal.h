// Internal to allocator/symmetric: what the TCP ByteExchange
// (byte_exchange.cc: frames and rounds) and its hello (tcp_hello.cc: party
// 0's admission of the others) share. multi_host.h states the contract.
#ifndef CMA_ALLOCATOR_SYMMETRIC_TCP_INTERNAL_H_
#define CMA_ALLOCATOR_SYMMETRIC_TCP_INTERNAL_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sodium.h>
#include <sys/socket.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "allocator/symmetric/multi_host.h"
#include "allocator/symmetric/wire.h"

namespace cma {
namespace tcp_internal {

inline constexpr std::uint32_t kTcpHelloMagic = 0x434d4154;  // "CMAT"
// Party 0's notice to a connector it drops before judging its hello (too
// many waiting, or too slow): {magic, version}, in place of a challenge or
// an ack. It proves nothing (party 0 has not proved the token to this
// connector yet), so a connector takes it only as a reason to try again.
inline constexpr std::uint32_t kTcpBusyMagic = 0x434d4159;  // "CMAY"
// 4: the busy notice.
inline constexpr std::uint32_t kTcpVersion = 4;
// The hello, as a mutual challenge-response under the rendezvous token,
// each side with its own fresh nonce (Nr: the root's, Nc: the connector's):
//   root -> connector: {magic, version, Nr}                     (challenge)
//   connector -> root: {magic, version, index, count, Nc,
//                       HMAC(token, "cma-tcph" version index count Nr Nc)}
//   root -> connector: {magic, version,
//                       HMAC(token, "cma-tcpa" version index count Nr Nc)}
// The ack names Nc, which the connector drew for this hello alone: a
// recorded ack does not verify in another hello, even one offering the
// same Nr (a fake root replaying a real root's challenge).
inline constexpr std::size_t kTcpMac = crypto_auth_hmacsha256_BYTES;
inline constexpr std::size_t kTcpChallenge = 8 + wire::kNonceBytes;
inline constexpr std::size_t kTcpHello = 16 + wire::kNonceBytes + kTcpMac;
inline constexpr std::size_t kTcpAck = 8 + kTcpMac;
inline constexpr int kMaxParties = 4096;
// The listen backlog (the kernel caps it at net.core.somaxconn): a flood of
// connections must not fill it before party 0 accepts them.
inline constexpr int kTcpBacklog = 4096;

template <typename T>
void Put(std::string& out, const T& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(v));
}
template <typename T>
T At(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// `nonces`: Nr then Nc (each kNonceBytes).
inline std::string TcpMac(const std::string& token, const char* label, std::int32_t index,
                          std::int32_t count, const std::string& nonces) {
  std::string msg = label;
  Put(msg, kTcpVersion);
  Put(msg, index);
  Put(msg, count);
  msg += nonces;
  return wire::HmacSha256(token, msg);
}
inline bool TcpMacOk(const char* got, const std::string& want) {
  return wire::MacMatches(absl::string_view(got, kTcpMac), want);
}

inline absl::Status CheckParty(int index, int count) {
  if (count < 1 || count > kMaxParties || index < 0 || index >= count) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "leaders' exchange: party %d of %d is not valid (at most %d parties)", index, count,
        kMaxParties));
  }
  return absl::OkStatus();
}

// Socket address of a numeric IPv4 or IPv6 host.
inline absl::Status ParseAddress(const std::string& host, int port, sockaddr_storage* out,
                                 socklen_t* len) {
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrFormat("leaders' exchange: bad port %d", port));
  }
  std::memset(out, 0, sizeof(*out));
  auto* v4 = reinterpret_cast<sockaddr_in*>(out);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(out);
  if (inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<std::uint16_t>(port));
    *len = sizeof(*v4);
  } else if (inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<std::uint16_t>(port));
    *len = sizeof(*v6);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "leaders' exchange: '", host, "' is not a numeric IPv4 or IPv6 address"));
  }
  return absl::OkStatus();
}

inline void NoDelay(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// The TCP ByteExchange over the parties' connections (byte_exchange.cc).
std::unique_ptr<ByteExchange> NewTcpByteExchange(int index, int count, absl::Duration timeout,
                                                 std::vector<int> peers);

}  // namespace tcp_internal
}  // namespace cma

#endif  // CMA_ALLOCATOR_SYMMETRIC_TCP_INTERNAL_H_
