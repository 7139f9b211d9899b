// Memory for the kernel's weight copies on transparent huge pages (2 MiB), where Linux offers them.
//
// The products stream every weight from memory once per forward: SmolLM2-135M's 538 MB are 131k pages of 4 KiB, each
// a TLB miss and a page walk, and the hardware prefetchers stop at every 4 KiB page boundary. On 2 MiB pages the same
// products run 5-7% faster at every row count (one thread, AMD EPYC Zen 4: one row 17.3 -> 16.4 ms, 6 rows 21.9 ->
// 20.5, 8 rows 23.1 -> 21.4). Linux backs anonymous memory with huge pages where the process asks for them
// (madvise(MADV_HUGEPAGE), the "madvise" setting most distributions ship; "always" needs no asking), in 2 MiB-aligned
// ranges. So copies are carved out of 2 MiB-aligned arenas of 64 MiB (a copy of more than half of that gets a mapping
// of its own): untouched pages of an arena cost nothing (no resident memory), a freed copy's pages go back to the OS
// (MADV_DONTNEED), an arena is unmapped when the last copy in it is freed (the current one is reused from its start
// instead), so copies made again and again (weights loaded anew) do not pile up. Where the mapping or the advice fails (another
// OS, a kernel without THP), the copy is an ordinary tensor: speed only, never a different result.
#include "tensor.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <mutex>

namespace {

constexpr size_t HUGE_PAGE = size_t(2) << 20;
constexpr size_t ARENA = size_t(64) << 20;
constexpr size_t ALIGN = 64;  // a cache line: the kernel's loads never straddle two

struct Arena {
  char* base;
  size_t size, used;
  int64_t live;  // copies in it not yet freed
};

std::mutex arenas;
Arena* current = nullptr;  // where small copies are carved from

// `size` bytes (a multiple of HUGE_PAGE) at a 2 MiB-aligned address, advised onto huge pages; nullptr if mmap fails.
char* map_huge(size_t size) {
  void* raw = mmap(nullptr, size + HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  char* start = static_cast<char*>(raw);
  char* aligned = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(start) + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1));
  if (aligned > start) munmap(start, aligned - start);  // the slack before and after the aligned range
  char* end = start + size + HUGE_PAGE;
  if (end > aligned + size) munmap(aligned + size, end - (aligned + size));
#ifdef MADV_HUGEPAGE
  madvise(aligned, size, MADV_HUGEPAGE);  // advice only: refused, the pages stay 4 KiB
#endif
  return aligned;
}

void release(Arena* arena, char* data, size_t size) {
  std::lock_guard<std::mutex> hold(arenas);
  if (--arena->live > 0) {  // others still in it: give this copy's whole pages back to the OS meanwhile
    const uintptr_t page = 4096, from = (reinterpret_cast<uintptr_t>(data) + page - 1) & ~(page - 1);
    const uintptr_t to = (reinterpret_cast<uintptr_t>(data) + size) & ~(page - 1);
    if (to > from) madvise(reinterpret_cast<void*>(from), to - from, MADV_DONTNEED);
    return;
  }
  if (arena == current) {  // empty again: carve from its start
    arena->used = 0;
    return;
  }
  munmap(arena->base, arena->size);
  delete arena;
}

}  // namespace

// An uninitialised uint8 tensor of `nbytes`, 64-byte aligned, on huge pages where the OS gives them.
at::Tensor huge_page_empty(int64_t nbytes) {
  TORCH_CHECK(nbytes >= 0, "huge_page_empty: a size of at least 0 bytes");
  const size_t need = std::max<size_t>(ALIGN, (static_cast<size_t>(nbytes) + ALIGN - 1) / ALIGN * ALIGN);
  Arena* arena = nullptr;
  char* data = nullptr;
  {
    std::lock_guard<std::mutex> hold(arenas);
    if (need > ARENA / 2) {  // a large copy (an lm_head): a mapping of its own
      const size_t size = (need + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
      if (char* base = map_huge(size)) {
        arena = new Arena{base, size, need, 1};
        data = base;
      }
    } else {
      if (current == nullptr || current->used + need > current->size) {
        if (current != nullptr && current->live == 0) {  // nothing left in it: unmapped now, not by a deleter
          munmap(current->base, current->size);
          delete current;
        }
        current = nullptr;
        if (char* base = map_huge(ARENA)) current = new Arena{base, ARENA, 0, 0};
      }
      if (current != nullptr) {
        arena = current;
        data = current->base + current->used;
        current->used += need;
        ++current->live;
      }
    }
  }
  if (data == nullptr) return at::empty({nbytes}, at::TensorOptions().dtype(at::kByte));
  return at::from_blob(data, {nbytes}, [arena, data, need](void*) { release(arena, data, need); },
                       at::TensorOptions().dtype(at::kByte));
}
