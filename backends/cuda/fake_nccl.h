// A stand-in for NCCL's shared library, for nccl_api_test: the few entry
// points nccl_api.cc loads, over a communicator whose behaviour the test
// sets field by field. Not thread-safe; one test at a time.
//
// A communicator is busy (its previous operation in progress) while
// `busy_polls` > 0: each ncclCommGetAsyncError answers ncclInProgress and
// counts one down. Any other call on a busy communicator is counted in
// `used_while_busy` and refused with ncclInvalidUsage, as NCCL refuses it.
// A window registration or deregistration makes it busy for `call_polls`
// polls (0: a blocking communicator's call, finished at once), after which
// `async_error` is its outcome.
#ifndef CMA_BACKENDS_CUDA_FAKE_NCCL_H_
#define CMA_BACKENDS_CUDA_FAKE_NCCL_H_

struct FakeNcclComm {
  int size = 2;
  int rank = 0;
  int device = 0;
  long busy_polls = 0;
  long call_polls = 0;
  int async_error = 0;        // the outcome of the call once its polls are done
  int register_result = 0;    // what ncclCommWindowRegister itself returns when not deferred
  void* window = nullptr;     // what a registration hands back
  const char* last_error = "";
  int used_while_busy = 0;
  int polls = 0;              // ncclCommGetAsyncError calls
  int registrations = 0;
  int deregistrations = 0;
};

#endif  // CMA_BACKENDS_CUDA_FAKE_NCCL_H_
