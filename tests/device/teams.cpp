// The host-callable part of the device API (team algebra, resource buffer offsets, ncclSymPtr
// arithmetic), compiled as plain C++ against ferronickel's headers and against NVIDIA's: each
// prints one line per case, and tests/device_headers.rs requires the two outputs to be the same.
// ncclTeamRankInDifference is also checked here against a brute-force walk of the two teams.
#include <nccl.h>
#include <nccl_device.h>

#include <stdio.h>

static ncclTeam_t team(int nRanks, int rank, int stride) {
  ncclTeam_t t;
  t.nRanks = nRanks;
  t.rank = rank;
  t.stride = stride;
  return t;
}

int main() {
  int bad = 0, cases = 0;
  // Parents: world-like teams; subsets: every strided sub-team holding the caller.
  for (int n = 1; n <= 12; n++) {
    for (int me = 0; me < n; me++) {
      ncclTeam_t parent = team(n, me, 1);
      for (int inner = 1; inner <= n; inner++) {
        if (n % inner) continue;
        ncclTeam_t in = ncclTeamInnerFactor(parent, inner), out = ncclTeamOuterFactor(parent, inner);
        printf("factor n=%d me=%d inner=%d: in(%d,%d,%d) out(%d,%d,%d)\n", n, me, inner, in.nRanks, in.rank,
               in.stride, out.nRanks, out.rank, out.stride);
        for (ncclTeam_t sub : {in, out}) {
          for (int p = 0; p < n; p++) {
            printf("member %d->%d to %d\n", p, ncclTeamRankIsMember(sub, parent, p),
                   ncclTeamRankIsMember(sub, parent, p) ? ncclTeamRankToTeam(sub, parent, p) : -1);
          }
          // Brute force: the parent ranks not in sub, in order.
          int k = 0;
          for (int p = 0; p < n; p++) {
            if (ncclTeamRankIsMember(sub, parent, p)) continue;
            int got = ncclTeamRankInDifference(parent, sub, k);
            cases++;
            if (got != p) {
              fprintf(stderr, "ncclTeamRankInDifference(parent %d/%d, sub %d/%d/%d, %d) = %d, want %d\n", me, n,
                      sub.nRanks, sub.rank, sub.stride, k, got, p);
              bad++;
            }
            printf("difference %d: %d\n", k, got);
            k++;
          }
        }
      }
    }
  }
  for (ncclDevResourceHandle_t h = 0; h < 5; h++) printf("offset %u: %zu\n", h, ncclGetResourceBufferOffset(h));
  ncclSymPtr<double> a(nullptr, 64), b = a + 3;
  b -= 1;
  b += 5ull;
  ncclSymPtr<char> c = b;
  printf("symptr: %zu %ld %d %d %zu\n", b.offset, (long)(b - a), a == b, a != b, (c + 1).offset);
  printf("difference cases: %d, wrong: %d\n", cases, bad);
  return bad ? 1 : 0;
}
