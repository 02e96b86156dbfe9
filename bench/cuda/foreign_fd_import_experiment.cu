// What does the CUDA driver do when cuMemImportFromShareableHandle gets a
// POSIX file descriptor that is not a CUDA export? Tries a regular file, a
// memfd (what the host backend exports), a pipe, a closed descriptor and, as
// the control, a real export of cuMemCreate memory; prints each CUresult.
// A standalone experiment, built on the GPU machine:
//   nvcc -O2 -o ffi foreign_fd_import_experiment.cu -lcuda && ./ffi
// (result: bench/results/h200_final/foreign_fd_import.txt).
#include <cuda.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>

static void Try(const char* what, int fd) {
  CUmemGenericAllocationHandle h = 0;
  CUresult r = cuMemImportFromShareableHandle(
      &h, reinterpret_cast<void*>(static_cast<std::intptr_t>(fd)),
      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  const char* name = nullptr;
  cuGetErrorName(r, &name);
  std::printf("%-40s fd %3d -> %s\n", what, fd, name ? name : "?");
  if (r == CUDA_SUCCESS) cuMemRelease(h);
}

int main() {
  cuInit(0);
  CUdevice dev;
  cuDeviceGet(&dev, 0);
  CUcontext ctx;
  cuDevicePrimaryCtxRetain(&ctx, dev);
  cuCtxSetCurrent(ctx);
  // Control: a genuine export.
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t gran = 0;
  cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  CUmemGenericAllocationHandle mem;
  if (cuMemCreate(&mem, gran, &prop, 0) == CUDA_SUCCESS) {
    int exported = -1;
    cuMemExportToShareableHandle(&exported, mem, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    Try("a real export (control)", exported);
    close(exported);
    cuMemRelease(mem);
  }
  char path[] = "/tmp/ffi_regular_XXXXXX";
  int file = mkstemp(path);
  if (file >= 0 && ftruncate(file, 2 << 20) == 0) Try("a regular file (2 MiB)", file);
  unlink(path);
  int memfd = memfd_create("cma-vmm", MFD_CLOEXEC);
  if (memfd >= 0 && ftruncate(memfd, 2 << 20) == 0) Try("a memfd (2 MiB, as the host backend)", memfd);
  int fds[2];
  if (pipe(fds) == 0) Try("a pipe", fds[0]);
  int closed = dup(1);
  close(closed);
  Try("a closed descriptor", closed);
  return 0;
}
