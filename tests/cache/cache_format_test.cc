// The entry format and the key: every truncation and every single-bit flip is detected, the
// header repeats the key, every key field but spec changes the entry name, names are stable.
#include <string>
#include <vector>

#include "cache/cache_key.h"
#include "cache/entry_format.h"
#include "cache/testing.h"
#include "gtest/gtest.h"

namespace fusejit::cache {
namespace {

using testing::TestKey;
using testing::TestPayload;

TEST(CacheFormat, RoundTripsKeyAndPayload) {
  CacheKey key = TestKey(1);
  key.options = "weird\nvalue\\with\ttabs\x01 and \x7f";
  key.spec = "x:f32[1,2] | conv3d(out=8,k=3)";
  const std::string payload = TestPayload(1, 1000);
  const std::string bytes = EncodeEntry(key, payload);
  absl::StatusOr<DecodedEntry> d = DecodeEntry(bytes);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->key, key);
  EXPECT_EQ(d->payload, payload);
  EXPECT_TRUE(CheckKey(key, d->key).ok());
}

TEST(CacheFormat, HeaderIsReadableAndRepeatsTheKey) {
  const CacheKey key = TestKey(2);
  const std::string bytes = EncodeEntry(key, "PAYLOAD");
  EXPECT_EQ(bytes.substr(0, 8), "FJKCACHE");
  for (const std::string& line :
       {"source_hash: " + key.source_hash, "generator_version: " + key.generator_version,
        "nvrtc_version: " + key.nvrtc_version, "options: " + key.options, "arch: " + key.arch,
        "spec: " + key.spec, std::string("payload_bytes: 7")}) {
    EXPECT_NE(bytes.find(line + "\n"), std::string::npos) << line;
  }
  EXPECT_EQ(bytes.size(), kEntryOverhead + (bytes.find("PAYLOAD") - 24) + 7);
}

TEST(CacheFormat, EmptyPayloadRoundTrips) {
  absl::StatusOr<DecodedEntry> d = DecodeEntry(EncodeEntry(TestKey(3), ""));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->payload, "");
}

TEST(CacheFormat, EveryTruncationIsDetected) {
  const std::string bytes = EncodeEntry(TestKey(4), TestPayload(4, 300));
  for (size_t len = 0; len < bytes.size(); ++len) {
    EXPECT_FALSE(DecodeEntry(std::string_view(bytes).substr(0, len)).ok()) << "length " << len;
  }
  EXPECT_FALSE(DecodeEntry(bytes + "x").ok()) << "appended byte";
}

TEST(CacheFormat, EverySingleBitFlipIsDetected) {
  const std::string bytes = EncodeEntry(TestKey(5), TestPayload(5, 256));
  int detected = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string flipped = bytes;
      flipped[i] = static_cast<char>(flipped[i] ^ (1 << bit));
      if (!DecodeEntry(flipped).ok()) {
        ++detected;
      } else {
        ADD_FAILURE() << "flip of bit " << bit << " at offset " << i << " not detected";
      }
    }
  }
  EXPECT_EQ(detected, static_cast<int>(bytes.size() * 8));
}

TEST(CacheFormat, OtherFormatVersionIsRejected) {
  std::string bytes = EncodeEntry(TestKey(6), "x");
  bytes[8] = static_cast<char>(kFormatVersion + 1);
  absl::StatusOr<DecodedEntry> d = DecodeEntry(bytes);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("version"), std::string_view::npos) << d.status();
}

TEST(CacheFormat, CheckKeyNamesTheFieldThatDiffers) {
  const CacheKey a = TestKey(7);
  CacheKey b = a;
  b.arch = "sm_80";
  absl::Status s = CheckKey(a, b);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("arch"), std::string_view::npos) << s;
  b = a;
  b.spec = "another spelling";
  EXPECT_TRUE(CheckKey(a, b).ok()) << "spec is informational";
}

TEST(CacheKeyTest, EveryFieldButSpecChangesTheEntryName) {
  const CacheKey base = TestKey(8);
  const std::string name = base.EntryName();
  EXPECT_TRUE(IsEntryFileName(name)) << name;
  std::vector<std::string CacheKey::*> fields = {
      &CacheKey::source_hash, &CacheKey::generator_version, &CacheKey::nvrtc_version,
      &CacheKey::options, &CacheKey::arch};
  for (auto field : fields) {
    CacheKey changed = base;
    changed.*field += "x";
    EXPECT_NE(changed.EntryName(), name);
    EXPECT_FALSE(changed.SameEntryAs(base));
  }
  CacheKey spec_changed = base;
  spec_changed.spec = "other";
  EXPECT_EQ(spec_changed.EntryName(), name);
}

TEST(CacheKeyTest, FieldsCannotRunIntoEachOther) {
  CacheKey a = TestKey(9), b = TestKey(9);
  a.options = "-O3";
  a.arch = "sm_90";
  b.options = "-O3s";
  b.arch = "m_90";
  EXPECT_NE(a.EntryName(), b.EntryName());
  EXPECT_NE(HashSource("ab", std::vector<std::string>{"c"}),
            HashSource("a", std::vector<std::string>{"bc"}));
  EXPECT_NE(HashSource("a"), HashSource("a", std::vector<std::string>{""}));
}

// Pinned values: a change here orphans every cache on disk, so it must be deliberate (bump
// kFormatVersion / the key tag in cache_key.cc).
TEST(CacheKeyTest, NamesAreStable) {
  EXPECT_EQ(HashBytesHex(""), "99aa06d3014798d86001c324468d497f");  // XXH3-128 of nothing
  const std::string h =
      HashSource("__global__ void k() {}", std::vector<std::string>{"#pragma once"});
  EXPECT_EQ(h.size(), 32u);
  EXPECT_EQ(h, HashSource("__global__ void k() {}", std::vector<std::string>{"#pragma once"}));
  CacheKey key{.source_hash = "00112233445566778899aabbccddeeff",
               .generator_version = "fusejit 0.1.0",
               .nvrtc_version = "13.0",
               .options = "--gpu-architecture=sm_90",
               .arch = "sm_90",
               .spec = "ignored"};
  EXPECT_EQ(key.EntryName(),
            "c1324dd3a6d856363df6d9054a7bc331.fjk");  // checked with ctypes+libxxhash
}

TEST(CacheKeyTest, EntryFileNamesAreRecognized) {
  EXPECT_TRUE(IsEntryFileName("0123456789abcdef0123456789abcdef.fjk"));
  EXPECT_FALSE(IsEntryFileName("0123456789abcdef0123456789abcdeF.fjk"));
  EXPECT_FALSE(IsEntryFileName("0123456789abcdef0123456789abcde.fjk"));
  EXPECT_FALSE(IsEntryFileName("0123456789abcdef0123456789abcdef.fjk.tmp.1.2"));
  EXPECT_FALSE(IsEntryFileName("notes.txt"));
}

}  // namespace
}  // namespace fusejit::cache
