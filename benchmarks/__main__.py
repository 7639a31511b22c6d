"""Run every benchmark and print its figures (`make bench`)."""

if __name__ == "__main__":
    print("no benchmarks yet")
