#include <stdio.h>

int main(void) {
  printf("hello from a linked binary\n");
  return 0;
}
