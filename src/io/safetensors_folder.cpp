// HF checkpoint folder (SafetensorsFolder): the index model.safetensors.index.json naming each
// tensor's shard (parsed strictly: a tensor listed twice is an error, not the last one winning), or
// a single model.safetensors, or one .safetensors file; shards open lazily on first use.
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "hymoe/core/error.h"
#include "hymoe/io/safetensors.h"
#include "safetensors_detail.h"

namespace hymoe::io {

namespace fs = std::filesystem;
using detail::DuplicateKey;
using detail::json_message;
using detail::parse_strict;
using nlohmann::json;

namespace {

const char* const kIndexName = "model.safetensors.index.json";
const char* const kSingleName = "model.safetensors";

}  // namespace

SafetensorsFolder::SafetensorsFolder(const std::string& dir) : dir_(dir) {
    std::error_code ec;
    if (fs::is_regular_file(dir, ec)) {  // one .safetensors file
        fs::path p(dir);
        base_ = p.parent_path().string();
        std::string file = p.filename().string();
        auto f = std::make_unique<SafetensorsFile>(dir);
        for (const std::string& n : f->names())
            shard_of_[n] = file;
        shards_[file] = std::move(f);
    } else if (!fs::is_directory(dir, ec)) {
        HYMOE_FAIL_ONE(Exit::bad_input, dir, ": no such folder or .safetensors file");
    } else if (fs::exists(fs::path(dir) / kIndexName, ec)) {
        base_ = dir;
        index_ = (fs::path(dir) / kIndexName).string();
        std::ifstream in(index_, std::ios::binary);
        std::stringstream text;
        if (in.is_open())
            text << in.rdbuf();
        if (!in.is_open())
            HYMOE_FAIL_ONE(Exit::bad_input, index_, ": cannot open (", std::strerror(errno), ")");
        json index;
        std::optional<DuplicateKey> dup;
        try {
            index = parse_strict(text.str(), dup);
        } catch (const json::exception& e) {
            HYMOE_FAIL_ONE(Exit::bad_input, index_, ": not valid JSON: ", json_message(e));
        }
        if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
            HYMOE_FAIL_ONE(Exit::bad_input, index_, ": has no \"weight_map\" object");
        if (dup && dup->top == "weight_map")
            HYMOE_FAIL_ONE(Exit::bad_input,
                           index_,
                           ": tensor '",
                           dup->key,
                           "' appears more than once in \"weight_map\"");
        if (dup && dup->top.empty())
            HYMOE_FAIL_ONE(
                Exit::bad_input, index_, ": key '", dup->key, "' appears more than once");
        for (const auto& [name, shard] : index["weight_map"].items()) {
            if (!shard.is_string())
                HYMOE_FAIL_ONE(Exit::bad_input,
                               index_,
                               ": tensor '",
                               name,
                               "' maps to ",
                               shard.dump(),
                               ", not a shard file name");
            std::string file = shard.get<std::string>();
            if (file.empty() || file == "." || file == ".." ||
                file.find_first_of("/\\") != std::string::npos)
                HYMOE_FAIL_ONE(Exit::bad_input,
                               index_,
                               ": tensor '",
                               name,
                               "' maps to '",
                               file,
                               "', not a file name in the folder");
            shard_of_[name] = file;
        }
    } else if (fs::exists(fs::path(dir) / kSingleName, ec)) {
        base_ = dir;
        auto f = std::make_unique<SafetensorsFile>((fs::path(dir) / kSingleName).string());
        for (const std::string& n : f->names())
            shard_of_[n] = kSingleName;
        shards_[kSingleName] = std::move(f);
    } else {
        HYMOE_FAIL_ONE(Exit::bad_input, dir, ": holds neither ", kIndexName, " nor ", kSingleName);
    }
    for (const auto& e : shard_of_)
        names_.push_back(e.first);
}

const SafetensorsFile& SafetensorsFolder::file_of(const std::string& name) const {
    auto it = shard_of_.find(name);
    if (it == shard_of_.end())
        HYMOE_FAIL_ONE(Exit::bad_input,
                       dir_,
                       ": tensor '",
                       name,
                       "' is missing (",
                       shard_of_.size(),
                       " tensors in the checkpoint)");
    std::unique_ptr<SafetensorsFile>& shard = shards_[it->second];
    std::string path = (fs::path(base_) / it->second).string();
    if (!shard) {
        std::error_code ec;
        if (!fs::exists(path, ec))
            HYMOE_FAIL_ONE(Exit::bad_input,
                           path,
                           ": shard file is missing (",
                           kIndexName,
                           " puts tensor '",
                           name,
                           "' in it)");
        shard = std::make_unique<SafetensorsFile>(path);
    }
    if (!shard->has(name))
        HYMOE_FAIL_ONE(Exit::bad_input,
                       path,
                       ": tensor '",
                       name,
                       "' is not in this shard, though ",
                       kIndexName,
                       " puts it here");
    return *shard;
}

const SafetensorsInfo& SafetensorsFolder::info(const std::string& name) const {
    return file_of(name).info(name);
}

void SafetensorsFolder::read(const std::string& name, Tensor& dest) const {
    if (!read_fp8(name, true, 0, 0, dest))
        file_of(name).read(name, dest);
}

void SafetensorsFolder::read_rows(const std::string& name, int64_t row_begin, Tensor& dest) const {
    read_slice(name, 0, row_begin, dest);
}

void SafetensorsFolder::read_slice(const std::string& name,
                                   int dim,
                                   int64_t begin,
                                   Tensor& dest) const {
    if (!read_fp8(name, false, dim, begin, dest))
        file_of(name).read_slice(name, dim, begin, dest);
}

void SafetensorsFolder::check_all() const {
    for (const std::string& n : names_)
        file_of(n);
}

}  // namespace hymoe::io
