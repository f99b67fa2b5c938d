// The JSON of Ballast's API messages, one mapping for every output: the CLI's
// `-o json` and ballastd's HTTP API print the same document for a message.
#ifndef BALLAST_COMMON_PROTO_JSON_H_
#define BALLAST_COMMON_PROTO_JSON_H_

#include <google/protobuf/message.h>

#include <string>

namespace ballast {

// One line of JSON: protobuf's mapping with the proto field names
// (snake_case, as in the spec YAML), every scalar printed even when zero,
// enums by name, 64-bit integers as strings.
std::string ToJson(const google::protobuf::Message& message);

}  // namespace ballast

#endif  // BALLAST_COMMON_PROTO_JSON_H_
