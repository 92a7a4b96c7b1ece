#include "vitdeploy/topk.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

namespace vitdeploy {

std::vector<float> softmax(const float* logits, std::size_t n) {
    std::vector<float> out(n);
    if (n == 0) return out;
    const double peak = *std::max_element(logits, logits + n);
    double sum = 0.0;
    std::vector<double> e(n);
    for (std::size_t i = 0; i < n; ++i) sum += (e[i] = std::exp(static_cast<double>(logits[i]) - peak));
    for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<float>(e[i] / sum);
    return out;
}

std::vector<Scored> top_k(const std::vector<float>& probs, std::size_t k) {
    std::vector<int> order(probs.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return probs[a] > probs[b]; });
    order.resize(std::min(k, order.size()));
    std::vector<Scored> top;
    for (int i : order) top.push_back({i, probs[i]});
    return top;
}

std::string format_top(const std::vector<Scored>& top, const std::vector<std::string>& labels) {
    std::string text;
    char prob[32];
    for (const auto& s : top) {
        if (!text.empty()) text += ", ";
        std::snprintf(prob, sizeof prob, " %.4f", s.prob);
        text += (s.index < static_cast<int>(labels.size()) ? labels[s.index] : std::to_string(s.index)) + prob;
    }
    return text;
}

}  // namespace vitdeploy
