// The MPI communicator behind a comm::Comm, for the modules that must hand it to an MPI library
// (io/: parallel HDF5). Block code never includes this.
#pragma once

#include <mpi.h>

#include "hymoe/parallel/comm.h"

namespace hymoe::comm {

MPI_Comm mpi_handle(const Comm& c);

}  // namespace hymoe::comm
