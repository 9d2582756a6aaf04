#include <thread>
#include <chrono>
#include <vector>
namespace ns { template <typename T> struct Worker { void run(T n) { std::this_thread::sleep_for(std::chrono::seconds(n)); } }; }
int main() { std::thread t([] { ns::Worker<int>().run(100); }); ns::Worker<long>().run(100); t.join(); }
