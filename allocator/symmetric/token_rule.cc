// The rendezvous token's rule (exchange.h states it; wire::CheckToken).
// Process 0 answers any same-user hello with a MAC under the token, and a
// leader's messages cross the network, so whoever sees one challenge can
// test guesses offline: the token must be as strong as the MAC. Nothing can
// prove a string random, so these screens refuse what people make by hand
// (hex of a passphrase, hexspeak, repeats, runs, counting patterns, a few
// digits reused) while a random token passes them but for a small, stated
// chance (exchange.h), which MakeRendezvousToken absorbs by drawing again.
//
// Each screen's share of that chance, for 32 random digits (the fewest
// allowed, where every screen is at its loosest), as a bound or estimate,
// and as measured on random tokens (2e8; the text model's alone on 1.1e9):
//   3-digit substrings repeated, runs, uneven digits   (not found)  1.5e-8
//   every byte printable (trailing NULs dropped)       2.1e-7       1.8e-7
//   2^22 times likelier as typed text than at random   <= 2.4e-7
//   the same, the digits shifted by one or reversed    <= 2 x 1.2e-7
//   only decimal digits (below 39 of them)             2.9e-7
//   8 digits occurring twice                           <= 7e-8      3.5e-8
//   hexspeak over 3/8 of the digits                    ~7e-9        1e-8
//   a fixed or counting digit every 2nd to 4th place   ~5e-8        4.5e-8
// in all about 1.1e-6 summing the first column, with the first row as
// measured (3.4e-7 measured, 67 of 2e8, before the shifted, reversed and
// decimal screens and at 2^21; those add at most 5.3e-7 and the text
// threshold's rise takes 2.4e-7 off).
#include <algorithm>
#include <cmath>
#include <cstdint>
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

// ---- Hex of text -------------------------------------------------------
//
// What `echo passphrase | xxd -p` makes, and its variants: a C string's
// NUL, one odd byte, UTF-8 (or Latin-1) letters. Two screens:
//  - every byte printable ASCII or a tab, newline or carriage return,
//    trailing NULs dropped (exact, and cheap in false refusals);
//  - a likelihood ratio against a small model of typed text (below),
//    which forgives an odd byte or non-ASCII letters in a text that is
//    otherwise letters and spaces, where a share of printable bytes could
//    not: at 16 bytes, even "15 of 16 bytes printable" refuses a random
//    token once in 200 000, and "valid UTF-8 of printable characters" once
//    in 200 000 too.
//
// The model writes text as independent characters: a lowercase letter
// (34% of characters), a space (9%), an uppercase letter, a digit (6%
// each), punctuation (4%), a tab/newline/return (2%), another control byte
// (0.5%), a stray byte >= 0x80 (Latin-1, 3.5%), or a well-formed UTF-8
// character of 2, 3 or 4 bytes (20%, 13%, 2%; C1 controls excluded), each
// class's share spread evenly over its members. A token is refused when
// its bytes are at least 2^kTextBits times likelier under the model than
// as random bytes. Whatever the model, a random token reaches that with
// probability at most 2^-kTextBits (the ratio's mean under random bytes is
// at most 1, and the parse scored here is one of the model's ways to write
// the bytes, so it scores no higher than the model does), times 256/255
// for trailing NULs dropped. Per character: a lowercase letter scores
// 1.7 bits, a space 4.5, a digit 0.6, an uppercase letter -0.8,
// punctuation -1.6, a control byte -4.6, a stray high byte -3.8, a UTF-8
// character of 2, 3, 4 bytes 2.8, 5.2, 6.4. So a 16-byte passphrase of
// letters and spaces scores 28 bits and up, and still over 21 with an odd
// byte in place of a letter; 16 bytes of Cyrillic or Chinese score 22 to
// 26. A password of mixed case, digits and punctuation scores little (it
// looks random to this model): the printable screen catches it, unless it
// holds an odd byte too.
constexpr double kTextBits = 22;
// The hex of text shifted by a digit (an extra digit in front) or written
// backwards: no byte boundary, so no printable screen (it would refuse too
// many random tokens), only the likelihood, a little stricter.
constexpr double kShiftedTextBits = 23;

enum Class { kLower, kSpace, kUpper, kDigit, kPunct, kBlank, kControl, kHigh, kClasses };
constexpr double kShare[kClasses] = {0.34, 0.09, 0.06, 0.06, 0.04, 0.02, 0.005, 0.035};
constexpr double kMembers[kClasses] = {26, 1, 26, 10, 32, 3, 30, 128};
// UTF-8 characters of 2, 3 and 4 bytes: their share, and how many there are
// (2 bytes: C2-DF then 80-BF, less C2 80-9F, the C1 controls; 3 and 4:
// every well-formed sequence, surrogates and overlongs excluded).
constexpr double kUtf8Share[5] = {0, 0, 0.2, 0.13, 0.02};
constexpr double kUtf8Members[5] = {0, 0, 30 * 64 - 32, 61440, 1048576};

Class ClassOf(unsigned char b) {
  if (b >= 'a' && b <= 'z') return kLower;
  if (b == ' ') return kSpace;
  if (b >= 'A' && b <= 'Z') return kUpper;
  if (b >= '0' && b <= '9') return kDigit;
  if (b > ' ' && b < 0x7f) return kPunct;
  if (b == '\t' || b == '\n' || b == '\r') return kBlank;
  if (b >= 0x80) return kHigh;
  return kControl;
}

// log2 of (the model's probability of the character) / 256^-length, for
// each byte alone and for a UTF-8 character of each length.
struct TextScores {
  double byte[256];
  double utf8[5];
};
const TextScores& Scores() {
  static const TextScores scores = [] {
    TextScores s{};
    for (int b = 0; b < 256; ++b) {
      const Class c = ClassOf(static_cast<unsigned char>(b));
      s.byte[b] = std::log2(kShare[c] / kMembers[c] * 256);
    }
    for (int length = 2; length <= 4; ++length) {
      s.utf8[length] = std::log2(kUtf8Share[length] / kUtf8Members[length]) + 8.0 * length;
    }
    return s;
  }();
  return scores;
}

bool Continuation(unsigned char b) { return (b & 0xc0) == 0x80; }

// The length of the well-formed UTF-8 character of 2 to 4 bytes at
// b[i..n), or 0 (an ASCII byte, a stray byte, a C1 control, a truncated,
// overlong or surrogate sequence).
int Utf8Length(const std::vector<unsigned char>& b, std::size_t i, std::size_t n) {
  const unsigned char lead = b[i];
  int length = 0;
  unsigned char lo = 0x80, hi = 0xbf;  // the second byte's range
  if (lead >= 0xc2 && lead <= 0xdf) {
    length = 2;
    if (lead == 0xc2) lo = 0xa0;  // C2 80-9F: C1 controls
  } else if (lead >= 0xe0 && lead <= 0xef) {
    length = 3;
    if (lead == 0xe0) lo = 0xa0;  // overlong
    if (lead == 0xed) hi = 0x9f;  // surrogates
  } else if (lead >= 0xf0 && lead <= 0xf4) {
    length = 4;
    if (lead == 0xf0) lo = 0x90;  // overlong
    if (lead == 0xf4) hi = 0x8f;  // past U+10FFFF
  } else {
    return 0;
  }
  if (i + length > n || b[i + 1] < lo || b[i + 1] > hi) return 0;
  for (int k = 2; k < length; ++k) {
    if (!Continuation(b[i + k])) return 0;
  }
  return length;
}

// Whether `bytes` (trailing NULs dropped) look like text, by either screen.
// How much likelier `bytes` are under the text model than at random, in bits.
double TextBits(const std::vector<unsigned char>& bytes) {
  const TextScores& score = Scores();
  double bits = 0;
  for (std::size_t i = 0; i < bytes.size();) {
    const int length = Utf8Length(bytes, i, bytes.size());
    bits += length > 0 ? score.utf8[length] : score.byte[bytes[i]];
    i += length > 0 ? length : 1;
  }
  return bits;
}

bool LooksLikeText(std::vector<unsigned char> bytes) {
  while (!bytes.empty() && bytes.back() == 0) bytes.pop_back();
  if (bytes.empty()) return false;
  const bool printable = std::all_of(bytes.begin(), bytes.end(), [](unsigned char b) {
    return (b >= 0x20 && b <= 0x7e) || b == '\t' || b == '\n' || b == '\r';
  });
  return printable || TextBits(bytes) >= kTextBits;
}

// The bytes of digits [from, ...), paired from `from`.
std::vector<unsigned char> PairDigits(const std::vector<int>& digits, std::size_t from) {
  std::vector<unsigned char> bytes;
  for (std::size_t i = from; i + 1 < digits.size(); i += 2) {
    bytes.push_back(static_cast<unsigned char>(digits[i] * 16 + digits[i + 1]));
  }
  return bytes;
}

// ---- Hexspeak ----------------------------------------------------------
//
// Words spelt in hex digits (0 for o, 1 for i or l), kept to the common
// ones. Each four-digit word turns up in random digits once per 65 536
// places, "bad" once per 4 096, so covering 3/8 of a 32-digit token takes
// three words, or two and two "bad"s, by chance: about 7e-9 (measured
// 1e-8), and less the longer the token. One word among random digits is
// not refused: random digits hold one now and then.
constexpr const char* kHexspeak[] = {"dead", "beef", "cafe", "babe", "bad",    "f00d",  "feed",
                                     "face", "c0de", "b00b", "d00d", "0ff1ce", "dec0de"};

// How many of `lower`'s digits lie in an occurrence of a hexspeak word.
std::size_t HexspeakDigits(const std::string& lower) {
  std::vector<bool> covered(lower.size(), false);
  for (const char* word : kHexspeak) {
    const std::size_t length = std::char_traits<char>::length(word);
    for (std::size_t at = lower.find(word); at != std::string::npos;
         at = lower.find(word, at + 1)) {
      std::fill(covered.begin() + at, covered.begin() + at + length, true);
    }
  }
  return std::count(covered.begin(), covered.end(), true);
}

// ---- Repeats and counting -----------------------------------------------

// Whether some `length` digits (at most 16) occur twice, overlapping or not.
bool RepeatsSubstring(const std::vector<int>& digits, std::size_t length) {
  std::vector<std::uint64_t> seen;  // each substring of `length` digits as a number
  std::uint64_t window = 0;
  const std::uint64_t mask =
      length >= 16 ? ~std::uint64_t{0} : (std::uint64_t{1} << (4 * length)) - 1;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    window = ((window << 4) | static_cast<std::uint64_t>(digits[i])) & mask;
    if (i + 1 >= length) seen.push_back(window);
  }
  std::sort(seen.begin(), seen.end());
  return std::adjacent_find(seen.begin(), seen.end()) != seen.end();
}

// Whether the digits at positions r, r + period, r + 2 * period, ... count:
// step by one amount (mod 16) from each to the next, but for at most one
// step in 8 (counting in decimal, 8 9 0 1, wraps once in 10). Needs 8
// digits at least, so that the steps say something.
bool Counts(const std::vector<int>& digits, std::size_t period, std::size_t r, bool exactly) {
  int steps[16] = {};
  std::size_t total = 0;
  for (std::size_t i = r + period; i < digits.size(); i += period) {
    ++steps[(digits[i] - digits[i - period] + 16) % 16];
    ++total;
  }
  if (total < 7) return false;
  const std::size_t most = *std::max_element(steps, steps + 16);
  return total - most <= (exactly ? 0 : total / 8);
}

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
  std::string lower;
  for (char c : token) {
    const int v = HexValue(c);
    if (v < 0) return refuse("has characters that are not hex digits");
    digits.push_back(v);
    lower.push_back("0123456789abcdef"[v]);
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
  // A piece pasted twice. Past 64 digits, 9: a random token of 128 digits
  // has 7 000 pairs of places, and 8 digits would repeat once in 600 000.
  const std::size_t repeat = n > 64 ? 9 : 8;
  if (RepeatsSubstring(digits, repeat)) {
    return refuse(absl::StrFormat("repeats itself (a run of %d digits occurs twice)", repeat));
  }
  if (steps * 3 > (n - 1) * 2) {
    return refuse("is a run (over 2/3 of its adjacent digits are equal or consecutive)");
  }
  const std::size_t speak = HexspeakDigits(lower);
  if (speak * 8 >= n * 3) {
    return refuse(absl::StrFormat(
        "looks like hexspeak (words such as dead, beef, cafe, f00d cover %d of its %d digits)",
        speak, n));
  }
  const std::vector<int> reversed(digits.rbegin(), digits.rend());
  if (LooksLikeText(PairDigits(digits, 0)) ||
      TextBits(PairDigits(digits, 1)) >= kShiftedTextBits ||
      TextBits(PairDigits(reversed, 0)) >= kShiftedTextBits) {
    return refuse("looks like hex-encoded text (a passphrase?), not random digits");
  }
  // Decimal digits alone carry 3.32 bits each: fewer than 39 cannot hold
  // 128 bits, however they were drawn (a date, a phone number, pi).
  if (n < 39 && std::all_of(digits.begin(), digits.end(), [](int d) { return d < 10; })) {
    return refuse("has only decimal digits: fewer than 39 of them cannot hold 128 bits");
  }
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
  // Counting interleaved with another count or with anything ("1a2b3c4d",
  // "1x4y7z..."): the digits of every k-th place step by one amount.
  // Every 4th place holds only 8 digits of a 32-digit token, where one
  // counting place by chance is 16^-6: so there, two places must count,
  // and exactly. (Counting through every place is a run, or repeats
  // itself within 16 digits.)
  for (std::size_t k = 2; k <= 4; ++k) {
    std::size_t counting = 0;
    for (std::size_t r = 0; r < k; ++r) counting += Counts(digits, k, r, /*exactly=*/k == 4);
    if (counting >= (k == 4 ? 2 : 1)) {
      return refuse(absl::StrFormat(
          "counts (every %d-th digit steps by the same amount, as in 1a2b3c...)", k));
    }
  }
  return absl::OkStatus();
}

}  // namespace wire
}  // namespace cma
