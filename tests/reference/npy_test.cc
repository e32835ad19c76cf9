// Tests of reference/npy.h: round trips, the bytes written, headers numpy may write (1.0 and 2.0,
// several spellings) and every refusal, on files written byte by byte here.
#include "reference/npy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

namespace fusejit {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

class NpyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string templ = (fs::path(::testing::TempDir()) / "npy_test.XXXXXX").string();
    ASSERT_NE(::mkdtemp(templ.data()), nullptr);
    dir_ = templ;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  std::string WriteBytes(const std::string& name, const std::string& bytes) const {
    const std::string path = Path(name);
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }

  std::string ReadBytes(const std::string& path) const {
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }

  // A .npy file as numpy lays it out: magic, version, header length (2 bytes in 1.0, 4 in 2.0),
  // the dict padded with spaces to a multiple of 64 bytes and ended by '\n', then `data`.
  static std::string Npy(const std::string& dict, const std::string& data, int major = 1) {
    const size_t len_bytes = major == 1 ? 2 : 4;
    std::string header = dict;
    const size_t unpadded = 6 + 2 + len_bytes + header.size() + 1;
    header.append((64 - unpadded % 64) % 64, ' ');
    header += '\n';
    std::string out = "\x93NUMPY";
    out += static_cast<char>(major);
    out += '\0';
    for (size_t i = 0; i < len_bytes; ++i)
      out += static_cast<char>((header.size() >> (8 * i)) & 0xff);
    return out + header + data;
  }

  static std::string Floats(std::vector<float> v) {
    return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  }

  // The error message of reading `bytes` from a file named `name`.
  std::string ReadError(const std::string& name, const std::string& bytes) const {
    absl::StatusOr<HostTensor> t = ReadNpy(WriteBytes(name, bytes));
    EXPECT_FALSE(t.ok()) << name << " was accepted";
    return t.ok() ? "" : std::string(t.status().message());
  }

  fs::path dir_;
};

void ExpectSameBits(const HostTensor& got, const HostTensor& want) {
  EXPECT_EQ(got.shape, want.shape);
  ASSERT_EQ(got.data.size(), want.data.size());
  if (want.data.empty()) return;
  EXPECT_EQ(std::memcmp(got.data.data(), want.data.data(), want.data.size() * sizeof(float)), 0);
}

TEST_F(NpyTest, RoundTripsEveryRank) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<HostTensor> tensors = {
      {{2, 3}, {1.5f, -2, 0, -0.0f, 1e-30f, 3.4e38f}},
      {{5}, {nan, inf, -inf, 1, 2}},
      {{}, {42}},
      {{0, 3}, {}},
      {{1, 2, 1, 2, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}},
  };
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::string path = Path("t" + std::to_string(i) + ".npy");
    ASSERT_TRUE(WriteNpy(path, tensors[i]).ok());
    absl::StatusOr<HostTensor> back = ReadNpy(path);
    ASSERT_TRUE(back.ok()) << back.status();
    ExpectSameBits(*back, tensors[i]);
  }
  ASSERT_TRUE(WriteNpy(Path("t0.npy"), tensors[1]).ok());  // overwrites
  ExpectSameBits(*ReadNpy(Path("t0.npy")), tensors[1]);
  // Nothing but the files themselves is left in the folder (no temporaries).
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 5);
}

TEST_F(NpyTest, WritesVersion1HeaderAlignedTo64) {
  const std::string path = Path("a.npy");
  ASSERT_TRUE(WriteNpy(path, {{2, 3}, {1, 2, 3, 4, 5, 6}}).ok());
  const std::string bytes = ReadBytes(path);
  ASSERT_GE(bytes.size(), 10u);
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  const size_t header_len =
      static_cast<unsigned char>(bytes[8]) | static_cast<unsigned char>(bytes[9]) << 8;
  EXPECT_EQ((10 + header_len) % 64, 0u);
  EXPECT_EQ(bytes.size(), 10 + header_len + 24);
  const std::string header = bytes.substr(10, header_len);
  EXPECT_EQ(header.rfind("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 0), 0u);
  EXPECT_EQ(header.back(), '\n');
  ASSERT_TRUE(WriteNpy(path, {{5}, {1, 2, 3, 4, 5}}).ok());
  EXPECT_THAT(ReadBytes(path), HasSubstr("'shape': (5,), }"));
  ASSERT_TRUE(WriteNpy(path, {{}, {1}}).ok());
  EXPECT_THAT(ReadBytes(path), HasSubstr("'shape': (), }"));
}

TEST_F(NpyTest, ReadsVersion2AndOtherHeaderSpellings) {
  const std::string data = Floats({1, 2, 3, 4, 5, 6});
  const std::vector<std::pair<std::string, int>> headers = {
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 2},
      {"{\"shape\":(2,3),\"fortran_order\":False,\"descr\":\"<f4\"}", 1},
      {"{ 'descr' : '<f4' , 'fortran_order' : False , 'shape' : ( 2 , 3 , ) }", 1},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2L, 3L), }", 1},  // Python 2
  };
  for (const auto& [dict, major] : headers) {
    SCOPED_TRACE(dict);
    absl::StatusOr<HostTensor> t = ReadNpy(WriteBytes("h.npy", Npy(dict, data, major)));
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->shape, (Shape{2, 3}));
    EXPECT_EQ(t->data, (std::vector<float>{1, 2, 3, 4, 5, 6}));
  }
  absl::StatusOr<HostTensor> scalar = ReadNpy(WriteBytes(
      "s.npy", Npy("{'descr': '<f4', 'fortran_order': False, 'shape': ()}", Floats({7}))));
  ASSERT_TRUE(scalar.ok()) << scalar.status();
  EXPECT_EQ(scalar->shape, Shape{});
  EXPECT_EQ(scalar->data, std::vector<float>{7});
}

TEST_F(NpyTest, RefusesOtherDtypesNamingThem) {
  const std::string tail = "', 'fortran_order': False, 'shape': (2,), }";
  EXPECT_THAT(ReadError("x.npy", Npy("{'descr': '<f8" + tail, std::string(16, '\0'))),
              HasSubstr("x.npy: dtype '<f8' (float64) is not supported; fusejit reads float32 "
                        "little-endian ('<f4')"));
  EXPECT_THAT(ReadError("x.npy", Npy("{'descr': '>f4" + tail, std::string(8, '\0'))),
              HasSubstr("dtype '>f4' (float32 big-endian) is not supported"));
  EXPECT_THAT(ReadError("x.npy", Npy("{'descr': '<i4" + tail, std::string(8, '\0'))),
              HasSubstr("dtype '<i4' (int32) is not supported"));
  EXPECT_THAT(ReadError("x.npy", Npy("{'descr': '<f2" + tail, std::string(4, '\0'))),
              HasSubstr("dtype '<f2' (float16) is not supported"));
  EXPECT_THAT(
      ReadError("x.npy", Npy("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }",
                             std::string(8, '\0'))),
      HasSubstr("dtype [('a', '<f4')] (structured) is not supported"));
}

TEST_F(NpyTest, RefusesFortranOrder) {
  EXPECT_THAT(ReadError("f.npy", Npy("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }",
                                     Floats({1, 2, 3, 4, 5, 6}))),
              HasSubstr("f.npy: fortran_order is True (column-major data); fusejit reads C-order"));
}

TEST_F(NpyTest, RefusesBadMagicVersionAndTruncation) {
  EXPECT_THAT(ReadError("zip.npy", std::string("PK\x03\x04 not numpy at all", 22)),
              HasSubstr("zip.npy: not a .npy file: it starts with \"PK\\x03\\x04"));
  EXPECT_THAT(ReadError("empty.npy", ""), HasSubstr("empty.npy: not a .npy file"));
  std::string v4 = Npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", Floats({1}));
  v4[6] = 4;
  EXPECT_THAT(
      ReadError("v4.npy", v4),
      HasSubstr("v4.npy: .npy format version 4.0 is not supported; fusejit reads 1.0, 2.0"));
  EXPECT_THAT(ReadError("short.npy", std::string("\x93NUMPY\x01\x00\x76", 9)),
              HasSubstr("short.npy: truncated header length: expected 2 bytes, the file has 1"));
  const std::string full = Npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", "");
  EXPECT_THAT(ReadError("cut.npy", full.substr(0, 40)),
              HasSubstr("cut.npy: truncated header: expected 118 bytes, the file has 30"));
}

TEST_F(NpyTest, RefusesDataThatDoesNotMatchTheShape) {
  const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  EXPECT_THAT(ReadError("t.npy", Npy(dict, Floats({1, 2, 3, 4, 5}))),
              HasSubstr("t.npy: truncated data: shape [2,3] of float32 needs 24 data bytes, but "
                        "the file has 20 after its 128-byte header"));
  EXPECT_THAT(ReadError("t.npy", Npy(dict, Floats({1, 2, 3, 4, 5, 6, 7}))),
              HasSubstr("t.npy: trailing bytes: shape [2,3] of float32 needs 24 data bytes, but "
                        "the file has 28"));
}

TEST_F(NpyTest, RefusesMalformedAndOverlongHeaders) {
  EXPECT_THAT(
      ReadError("m.npy", Npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3}", "")),
      HasSubstr("m.npy: malformed .npy header"));
  EXPECT_THAT(ReadError("m.npy", Npy("{'descr': '<f4', 'fortran_order': False}", "")),
              HasSubstr("m.npy: the .npy header has no 'shape' key"));
  EXPECT_THAT(ReadError("m.npy", Npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), "
                                     "'extra': 1}",
                                     Floats({1}))),
              HasSubstr("m.npy: unexpected key 'extra'"));
  EXPECT_THAT(
      ReadError("m.npy", Npy("{'descr': '<f4', 'fortran_order': False, 'shape': (-1, 3)}", "")),
      HasSubstr("m.npy: shape (-1, 3) is not a tuple of non-negative integers"));
  EXPECT_THAT(
      ReadError("m.npy", Npy("{'descr': '<f4', 'fortran_order': False, 'shape': [2, 3]}", "")),
      HasSubstr("m.npy: shape [2, 3] is not a tuple of integers"));
  EXPECT_THAT(ReadError("m.npy", Npy("{'descr': '<f4', 'fortran_order': 0, 'shape': (1,)}", "")),
              HasSubstr("m.npy: fortran_order is 0; expected True or False"));
  // A 20000-byte header (format 2.0 allows 4 GB) is refused before it is read.
  const std::string huge_dict =
      "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }" + std::string(20000, ' ');
  EXPECT_THAT(ReadError("big.npy", Npy(huge_dict, Floats({1}), 2)),
              HasSubstr("big.npy: .npy header of 20084 bytes is longer than the 10000 bytes"));
}

TEST_F(NpyTest, ReadAndWriteErrorsNameTheFile) {
  absl::StatusOr<HostTensor> missing = ReadNpy(Path("nope.npy"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("nope.npy: cannot open for reading"));

  absl::Status mismatch = WriteNpy(Path("w.npy"), {{2, 3}, {1, 2, 3}});
  EXPECT_THAT(mismatch.message(),
              HasSubstr("w.npy: cannot write: shape [2,3] has 6 elements, but the data holds 3"));

  EXPECT_THAT(WriteNpy(Path("no/such/dir/w.npy"), {{1}, {1}}).message(),
              HasSubstr("w.npy: cannot create temporary file"));

  // Renaming onto a non-empty folder fails; the temporary file must not be left behind.
  fs::create_directories(Path("occupied/inner"));
  EXPECT_THAT(WriteNpy(Path("occupied"), {{1}, {1}}).message(), HasSubstr("rename of"));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
}

TEST(NpyHardening, ParseNpyChecksBytesInMemoryAndHugeItemSizesDoNotOverflow) {
  // Found by tests/fuzz (fuzz_npy): an item size whose bit count overflows int.
  std::string header = "{'descr': '<f666666664', 'fortran_order': False, 'shape': (2, 1), }";
  header.append(64 - (10 + header.size() + 1) % 64, ' ');
  header += '\n';
  std::string bytes = std::string("\x93NUMPY\x01\x00", 8);
  bytes += static_cast<char>(header.size() & 0xff);
  bytes += static_cast<char>(header.size() >> 8);
  bytes += header + std::string(8, '\0');
  absl::StatusOr<HostTensor> t = ParseNpy(bytes, "huge.npy");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(std::string(t.status().message()).find("float5333333312) is not supported"),
            std::string::npos)
      << t.status();
  // And a valid one, from memory.
  header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }";
  header.append(64 - (10 + header.size() + 1) % 64, ' ');
  header += '\n';
  bytes = std::string("\x93NUMPY\x01\x00", 8);
  bytes += static_cast<char>(header.size() & 0xff);
  bytes += static_cast<char>(header.size() >> 8);
  const float data[2] = {1.5f, -2.0f};
  bytes += header + std::string(reinterpret_cast<const char*>(data), sizeof(data));
  t = ParseNpy(bytes, "ok.npy");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->shape, (Shape{2}));
  EXPECT_EQ(t->data, (std::vector<float>{1.5f, -2.0f}));
  EXPECT_FALSE(ParseNpy(bytes.substr(0, bytes.size() - 1), "short.npy").ok());
}

}  // namespace
}  // namespace fusejit
