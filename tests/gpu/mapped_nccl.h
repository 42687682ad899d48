// print_mapped_nccl(prefix): which libnccl files this process has mapped, then the version the
// NCCL it calls answers, each line after `prefix`: the proof of what served the calls (run.sh
// looks for "mapped: <the shim>"). Shared by the GPU programs.
#pragma once
#include <nccl.h>
#include <stdio.h>
#include <string.h>

static void print_mapped_nccl(const char* prefix) {
  FILE* maps = fopen("/proc/self/maps", "r");
  char line[4096], last[4096] = "";
  while (maps && fgets(line, sizeof line, maps)) {
    char* path = strchr(line, '/');
    if (!path || !strstr(path, "libnccl") || strcmp(path, last) == 0) continue;
    strcpy(last, path);
    printf("%smapped: %s", prefix, path);
  }
  if (maps) fclose(maps);
  int version = 0;
  ncclGetVersion(&version);
  printf("%sncclGetVersion: %d\n", prefix, version);
}
