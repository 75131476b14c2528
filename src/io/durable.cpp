// fsync and atomic folder replacement (io/durable.h).
#include "hymoe/io/durable.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <stdio.h>
#include <unistd.h>

#include "hymoe/core/error.h"

namespace hymoe::io {

namespace fs = std::filesystem;

void sync_path(const std::string& path) {
    const int fd = ::open(path.empty() ? "." : path.c_str(), O_RDONLY);
    if (fd < 0 || ::fsync(fd) != 0) {
        const std::string why = std::strerror(errno);
        if (fd >= 0)
            ::close(fd);
        HYMOE_FAIL_ONE(Exit::internal, "syncing ", path, " to disk: ", why);
    }
    ::close(fd);
}

void publish_dir(const std::string& fresh, const std::string& dir) {
    if (!fs::is_directory(fresh))
        HYMOE_FAIL_ONE(Exit::internal, "publishing ", fresh, " as ", dir, ": it is not a folder");
    for (const auto& entry : fs::directory_iterator(fresh))
        if (entry.is_regular_file())
            sync_path(entry.path().string());
    sync_path(fresh);
    const auto fail = [&](const char* step) {
        HYMOE_FAIL_ONE(Exit::internal,
                       "publishing ",
                       fresh,
                       " as ",
                       dir,
                       ": ",
                       step,
                       ": ",
                       std::strerror(errno));
    };
    if (!fs::exists(dir)) {
        if (::rename(fresh.c_str(), dir.c_str()) != 0)
            fail("rename");
    } else if (::renameat2(AT_FDCWD, fresh.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) {
        fs::remove_all(fresh);  // now the old folder
    } else if (errno == EINVAL || errno == ENOSYS || errno == ENOTSUP) {
        const std::string aside = dir + ".old";
        fs::remove_all(aside);
        if (::rename(dir.c_str(), aside.c_str()) != 0)
            fail("moving the old folder aside");
        if (::rename(fresh.c_str(), dir.c_str()) != 0)
            fail("rename");
        fs::remove_all(aside);
    } else {
        fail("renameat2");
    }
    sync_path(fs::path(dir).parent_path().string());
}

}  // namespace hymoe::io
