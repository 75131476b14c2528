// Durable file-system steps every writer shares: fsync a file or folder, and publish a folder
// written under a temporary name in place of an older one so that, at every instant, the name
// holds either the old complete folder or the new complete one.
#pragma once

#include <string>

namespace hymoe::io {

// fsync a file or a folder ("" = the current folder): a crash after this cannot lose it (or, for
// a folder, a rename in it). Exit::internal naming the path if the system refuses.
void sync_path(const std::string& path);

// Makes the finished folder `fresh` appear as `dir`: fresh's files and fresh are synced, then
// swapped with an existing dir in one renameat2(RENAME_EXCHANGE) and the old one removed, or
// renamed into place when there is no dir; the parent folder synced last. Where the file system
// cannot exchange (some network file systems), the old dir is first renamed aside to dir.old,
// which a crash may leave behind but never loses. Exit::internal naming both paths on failure.
void publish_dir(const std::string& fresh, const std::string& dir);

}  // namespace hymoe::io
