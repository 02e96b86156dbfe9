// The rendezvous token's rule (exchange.h; wire::CheckToken). Process 0
// answers any same-user hello with a MAC under the token, and a leader's
// messages cross the network, so whoever sees one challenge can test
// guesses offline: the token must be as strong as the MAC. Nothing can
// prove a string random, so these screens refuse what people make by hand
// (hex of a passphrase, repeats, runs, patterns, a few digits reused) and
// pass a random token with a probability of failing below 1e-6 at 32 digits
// (1e-13 at 64); MakeRendezvousToken redraws in that case.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "allocator/symmetric/wire.h"

namespace cma {
namespace wire {
namespace {

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The least Shannon entropy per digit of the digits' histogram: a random
// token of 32 digits has about 3.6 bits and falls under 2.5 practically
// never; one drawn from five digits or fewer has at most 2.33.
constexpr double kMinBitsPerDigit = 2.5;

}  // namespace

absl::Status CheckToken(const std::string& token) {
  const auto refuse = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "symmetric exchange: the rendezvous token %s; it needs at least 128 bits of entropy, so "
        "it must be %d to %d hex digits from a random source: MakeRendezvousToken makes one "
        "(or: python3 -c 'import secrets; print(secrets.token_hex(32))', or openssl rand -hex "
        "32), never a passphrase or a pattern typed by hand",
        why, kMinTokenBytes, kMaxTokenBytes));
  };
  // A hex digit carries at most 4 bits, so 32 digits are the least that
  // can hold 128.
  if (token.size() < kMinTokenBytes || token.size() > kMaxTokenBytes) {
    return refuse(absl::StrFormat("has %d characters", token.size()));
  }
  std::vector<int> digits;
  for (char c : token) {
    if (HexValue(c) < 0) return refuse("has characters that are not hex digits");
    digits.push_back(HexValue(c));
  }
  const std::size_t n = digits.size();
  std::vector<int> grams;  // each 3-digit substring as a number
  std::size_t steps = 0;   // adjacent digits that are equal or consecutive
  for (std::size_t i = 0; i + 1 < n; ++i) {
    steps += std::abs(digits[i] - digits[i + 1]) <= 1;
    if (i + 2 < n) grams.push_back(digits[i] * 256 + digits[i + 1] * 16 + digits[i + 2]);
  }
  std::sort(grams.begin(), grams.end());
  const std::size_t distinct = std::unique(grams.begin(), grams.end()) - grams.begin();
  if (distinct * 4 < grams.size() * 3) {
    return refuse("repeats itself (fewer than 3/4 of its 3-digit substrings are distinct)");
  }
  if (steps * 3 > (n - 1) * 2) {
    return refuse("is a run (over 2/3 of its adjacent digits are equal or consecutive)");
  }
  // Hex of text (what `echo passphrase | xxd -p` makes): every byte
  // printable ASCII or a tab, newline or carriage return (a random token of
  // 32 digits is that with probability (98/256)^16, about 2e-7).
  bool text = true;
  for (std::size_t i = 0; i + 1 < n && text; i += 2) {
    const int byte = digits[i] * 16 + digits[i + 1];
    text = (byte >= 0x20 && byte <= 0x7e) || byte == '\t' || byte == '\n' || byte == '\r';
  }
  if (text) return refuse("is the hex of printable text (a passphrase?)");
  // A few digits used over and over.
  int count[16] = {};
  for (int d : digits) ++count[d];
  double bits = 0;
  for (int c : count) {
    if (c > 0) bits -= c / static_cast<double>(n) * std::log2(c / static_cast<double>(n));
  }
  if (bits < kMinBitsPerDigit) {
    return refuse(absl::StrFormat(
        "uses its digits too unevenly (an estimated %.2f bits per digit; at least %.1f expected)",
        bits, kMinBitsPerDigit));
  }
  // A pattern with a fixed digit every k-th position ("a0a1a2..."): the
  // other digits alone must then carry the 128 bits.
  for (std::size_t k = 2; k <= 4; ++k) {
    for (std::size_t r = 0; r < k; ++r) {
      bool same = true;
      for (std::size_t i = r + k; i < n && same; i += k) same = digits[i] == digits[r];
      if (same) {
        return refuse(absl::StrFormat("is a pattern (every %d-th digit is the same)", k));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace wire
}  // namespace cma
