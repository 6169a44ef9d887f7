// The TensorBoard event encoding (trainer/src/run/tensorboard_writer.h) against bytes
// computed by hand and by TensorBoard's own Python (its CRC and the protobuf
// serializer of tensorflow.Event), the scalars taken from a metrics record, and the
// writer's files. Reading real runs' files with TensorBoard is tensorboard_events_test.
#include "run/tensorboard_writer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "dufu/common/error.h"
#include "support/temp_dir.h"
#include "support/tool_runner.h"

namespace {

namespace fs = std::filesystem;
using dufu::testing::read_all;
using dufu::testing::TempDir;
namespace trainer = dufu::trainer;

std::string bytes(std::initializer_list<unsigned> values) {
  std::string out;
  for (unsigned value : values) out.push_back(static_cast<char>(value));
  return out;
}

TEST(Crc32cTest, StandardCheckValues) {
  // The CRC catalogue's check value, and the iSCSI vectors of RFC 3720, appendix B.4.
  EXPECT_EQ(trainer::crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(trainer::crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(trainer::crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  std::string ascending;
  std::string descending;
  for (int i = 0; i < 32; ++i) {
    ascending.push_back(static_cast<char>(i));
    descending.push_back(static_cast<char>(31 - i));
  }
  EXPECT_EQ(trainer::crc32c(ascending), 0x46DD794Eu);
  EXPECT_EQ(trainer::crc32c(descending), 0x113FDB5Cu);
}

TEST(Crc32cTest, MaskRotatesAndAddsTheConstant) {
  // 0xE3069283 rotated right by 15 is 0x2507C60D; plus 0xA282EAD8 modulo 2^32 is
  // 0xC78AB0E5, as TensorBoard's masked_crc32c(b"123456789") also gives.
  EXPECT_EQ(trainer::masked_crc32c("123456789"), 0xC78AB0E5u);
}

// Event{wall_time: 1.5, step: 3, summary {value {tag: "a", simple_value: 2}}}, as
// protobuf serializes it.
const std::string kSmallEvent =
    bytes({0x09, 0, 0, 0, 0, 0, 0, 0xf8, 0x3f,  // wall_time, double 1.5
           0x10, 0x03,                          // step 3
           0x2a, 0x0a,                          // summary, 10 bytes
           0x0a, 0x08,                          //   value, 8 bytes
           0x0a, 0x01, 'a',                     //     tag "a"
           0x15, 0, 0, 0, 0x40});               //     simple_value, float 2.0

TEST(TensorBoardEventTest, ScalarsEventIsTheProtobufEncoding) {
  EXPECT_EQ(trainer::scalars_event(1.5, 3, {{"a", 2.0f}}), kSmallEvent);
}

TEST(TensorBoardEventTest, FileVersionAndSessionStartEvents) {
  // step 0 is left out, as protobuf leaves out a field at its default.
  EXPECT_EQ(trainer::file_version_event(1.5),
            bytes({0x09, 0, 0, 0, 0, 0, 0, 0xf8, 0x3f, 0x1a, 0x0d}) + "brain.Event:2");
  // session_log (field 7) {status: START (1)} at step 5.
  EXPECT_EQ(trainer::session_start_event(1.5, 5),
            bytes({0x09, 0, 0, 0, 0, 0, 0, 0xf8, 0x3f, 0x10, 0x05, 0x3a, 0x02, 0x08, 0x01}));
}

TEST(TensorBoardEventTest, LongFieldsHaveMultiByteLengths) {
  // A 200-byte tag: its length is the varint 0xc8 0x01, the value's 208 is 0xd0 0x01.
  const std::string tag(200, 't');
  const std::string event = trainer::scalars_event(0.0, 300, {{tag, 1.0f}});
  const std::string expected_start = bytes({0x09, 0, 0, 0, 0, 0, 0, 0, 0,  // wall_time 0.0
                                            0x10, 0xac, 0x02,              // step 300
                                            0x2a, 0xd3, 0x01,              // summary, 211 bytes
                                            0x0a, 0xd0, 0x01,              //   value, 208 bytes
                                            0x0a, 0xc8, 0x01}) +           //     tag, 200 bytes
                                     tag + bytes({0x15, 0, 0, 0x80, 0x3f});
  EXPECT_EQ(event, expected_start);
}

TEST(TensorBoardEventTest, RecordFraming) {
  // Length 23 in 8 bytes, its masked CRC, the data, the data's masked CRC (the CRCs
  // from TensorBoard's masked_crc32c).
  const std::string expected = bytes({23, 0, 0, 0, 0, 0, 0, 0, 0xe7, 0xce, 0xf8, 0x1e}) + kSmallEvent +
                               bytes({0xe8, 0x1c, 0x3a, 0x9d});
  EXPECT_EQ(trainer::tfrecord_frame(kSmallEvent), expected);
}

TEST(MetricsScalarsTest, EveryNumericMemberTaggedByRecordType) {
  const trainer::MetricsScalars train = trainer::metrics_record_scalars(
      R"({"type":"train","step":12,"loss":3.5,"lr":0.001,"consumed_tokens":18446744073709551615,)"
      R"("skipped":true,"grad_norm":null,"note":"text","shape":[1,2]})");
  EXPECT_EQ(train.step, 12);
  ASSERT_EQ(train.scalars.size(), 5u);
  EXPECT_EQ(train.scalars[0].tag, "train/loss");
  EXPECT_EQ(train.scalars[0].value, 3.5f);
  EXPECT_EQ(train.scalars[1].tag, "train/lr");
  EXPECT_EQ(train.scalars[1].value, 0.001f);
  EXPECT_EQ(train.scalars[2].tag, "train/consumed_tokens");
  EXPECT_EQ(train.scalars[2].value, 18446744073709551616.0f);
  EXPECT_EQ(train.scalars[3].tag, "train/skipped");
  EXPECT_EQ(train.scalars[3].value, 1.0f);
  EXPECT_EQ(train.scalars[4].tag, "train/grad_norm");
  EXPECT_TRUE(std::isnan(train.scalars[4].value));

  const trainer::MetricsScalars eval =
      trainer::metrics_record_scalars(R"({"type":"eval","step":4,"val_loss":2.25,"val_perplexity":9})");
  EXPECT_EQ(eval.step, 4);
  ASSERT_EQ(eval.scalars.size(), 2u);
  EXPECT_EQ(eval.scalars[0].tag, "eval/loss");
  EXPECT_EQ(eval.scalars[0].value, 2.25f);
  EXPECT_EQ(eval.scalars[1].tag, "eval/perplexity");
  EXPECT_EQ(eval.scalars[1].value, 9.0f);

  EXPECT_THROW(trainer::metrics_record_scalars(R"({"step":1,"loss":2})"), dufu::Error);
  EXPECT_THROW(trainer::metrics_record_scalars(R"({"type":"train","loss":2)"), dufu::Error);
}

std::vector<std::string> event_files(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with("events.out.tfevents.")) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

TEST(TensorBoardWriterTest, WritesFramedEventsAndStartsANewFileOnResume) {
  TempDir dir;
  std::string first_path;
  {
    trainer::TensorBoardWriter writer(dir.path(), 0);
    first_path = writer.path();
    dufu::JsonWriter record;
    record.begin_object().key("type").value("train").key("step").value(1).key("loss").value(2.5).end_object();
    writer.write(record);
  }
  const std::string name = fs::path(first_path).filename().string();
  // events.out.tfevents.SECONDS.HOST, SECONDS in 10 digits.
  ASSERT_TRUE(name.starts_with("events.out.tfevents.")) << name;
  EXPECT_EQ(name.find_first_not_of("0123456789", 20), 30u) << name;
  EXPECT_EQ(name[30], '.') << name;
  const std::string contents = read_all(first_path);
  // The file_version event first, then the restart marker at step 1, then the record.
  const std::string head = trainer::tfrecord_frame(trainer::file_version_event(0.0));
  ASSERT_GT(contents.size(), 12u);
  EXPECT_EQ(contents.substr(0, 8), head.substr(0, 8)) << "the first record is not the file_version event";
  EXPECT_NE(contents.find("brain.Event:2"), std::string::npos);
  EXPECT_NE(contents.find("train/loss"), std::string::npos);

  // A resumed run adds a file that sorts after the first; a new run replaces both.
  { trainer::TensorBoardWriter resumed(dir.path(), 1); }
  std::vector<std::string> files = event_files(dir.path());
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(files[0], name);
  { trainer::TensorBoardWriter fresh(dir.path(), 0); }
  files = event_files(dir.path());
  EXPECT_EQ(files.size(), 1u);
}

}  // namespace
